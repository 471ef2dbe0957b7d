// Fused CPU kernels for the time loops of the fast paths; loaded by models/fast/native.py.
//
// Why by hand: on a CPU the TorchScript loops of models/fast/loops.py and models/fast/scans.py spend
// most of their time launching 4-9 small kernels per time step (about 9 us each), not computing, and
// a multi-threaded BLAS call on a product of B = 8-32 rows barely uses the second core. Here each
// time step is one fused pass over its values: for the cells with a recurrent matrix the threads
// split the hidden units for the whole loop (see forward_loop), and the purely elementwise
// recursions (UBRU alpha, its backward passes, their gradients) run their whole time loop in one
// call, split across threads by unit. The arithmetic goes to ATen's own vectorised math
// (at::vec::Vectorized, SLEEF exp / log1p); the per-step products to a small kernel of ours in the AVX2
// build (see StepProduct: the BLAS is slow at a product of a few columns), else to the BLAS that
// libtorch calls (MKL on x86-64).
//
// Long because it is one translation unit: the build compiles one file, and the
// kernels share their vector helpers and the thread split. The units of the gated family (BRU, Li-BRU,
// Li-GRU, GRU, LSTM, MGU, RNN) are each a short struct, their elementwise step and its derivatives,
// run by one pair of drivers (see "The units of the gated family").
//
// Every op mirrors a TorchScript loop that stays as the fallback (GPU tensors, no C++ compiler), and
// the tests hold both to the reference loop of each unit. Layout is time-major: (T, B, width),
// contiguous. Shapes are checked by the Python callers; the TORCH_CHECKs guard against misuse.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// The AVX2 build multiplies the per-step products with its own kernel (see StepProduct); the
// BRU_KALDI_ATEN_GEMM check build leaves every product to ATen.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__) && !defined(BRU_KALDI_ATEN_GEMM)
#include <immintrin.h>
#define BRU_KALDI_PANEL_PRODUCT 1
#endif

namespace {

using at::Tensor;
template <typename T>
using Vec = at::vec::Vectorized<T>;

// Below this many units per thread, splitting the elementwise scans across threads does not pay.
constexpr int64_t kGrain = 2048;

template <typename T>
inline Vec<T> sigmoid(const Vec<T>& a) {
  const Vec<T> one(T(1));
  return one / (one + a.neg().exp());
}

// log sigma(a) = min(a, 0) - log1p(exp(-|a|)): never overflows.
template <typename T>
inline Vec<T> log_sigmoid(const Vec<T>& a) {
  return at::vec::minimum(a, Vec<T>(T(0))) - a.abs().neg().exp().log1p();
}

// softplus(u) - softplus(v), with softplus(u) = max(u, 0) + log1p(exp(-|u|)) (exact where torch's
// switches to u above 20); the two log1p are one log of a ratio: a quarter less transcendental work,
// for an absolute error of about one rounding of 1 (the result is a log-odds, used at that scale).
template <typename T>
inline Vec<T> softplus_difference(const Vec<T>& u, const Vec<T>& v) {
  const Vec<T> zero(T(0)), one(T(1));
  const auto ratio = (one + u.abs().neg().exp()) / (one + v.abs().neg().exp());
  return at::vec::maximum(u, zero) - at::vec::maximum(v, zero) + ratio.log();
}

// tanh(a) = sign(a) (-e) / (2 + e) with e = expm1(-2 |a|): one expm1 and a division, about half the
// time of ATen's vectorised tanh (the baselines' steps are mostly tanh), and as accurate relative to
// the value at any a (expm1, not exp: no cancellation near 0).
template <typename T>
inline Vec<T> fast_tanh(const Vec<T>& a) {
  const Vec<T> zero(T(0));
  const auto e = (a.abs() * Vec<T>(T(-2))).expm1();
  const auto y = e.neg() / (Vec<T>(T(2)) + e);
  return Vec<T>::blendv(y, y.neg(), a < zero);
}

template <typename T>
inline Vec<T> logaddexp(const Vec<T>& a, const Vec<T>& b) {
  return at::vec::maximum(a, b) + (a - b).abs().neg().exp().log1p();
}

template <typename T>
inline Vec<T> load(const T* p, int64_t n) {
  return Vec<T>::loadu(p, n);
}

// f(j, n) over [0, len) in vector-sized pieces; the last piece may be shorter (n < Vec::size()).
template <typename T, typename F>
inline void vec_for(int64_t len, const F& f) {
  constexpr int64_t V = Vec<T>::size();
  for (int64_t j = 0; j < len; j += V) f(j, std::min<int64_t>(V, len - j));
}

// Splits the flat range [begin, end) of a (rows, W) array into row pieces: f(offset, w0, len),
// offset = row * W + w0. Per-unit constants are indexed by w0.
template <typename F>
inline void for_row_pieces(int64_t begin, int64_t end, int64_t W, const F& f) {
  while (begin < end) {
    const int64_t w0 = begin % W, len = std::min(end - begin, W - w0);
    f(begin, w0, len);
    begin += len;
  }
}

// A number in an error message, as text. Messages take numbers only through this, never through an
// ostream's operator<<: on one machine (torch 2.11's wheel; the extension built by a compiler whose
// libstdc++ was not the one the process loaded, so the library held its own copy of std::num_put)
// formatting an integer inside TORCH_CHECK's message crashed the process, for every build of these
// kernels, so that a malformed call killed Python instead of raising. std::to_string needs no locale.
inline std::string text(int64_t value) {
  return std::to_string(value);
}

void check_cpu_contiguous(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "bru_kaldi native kernels: ", name, " must be on the CPU");
  TORCH_CHECK(t.is_contiguous(), "bru_kaldi native kernels: ", name, " must be contiguous");
}

// ---------------------------------------------------------------------------------------------
// Elementwise recursions (models/fast/scans.py)

// x_t = c_t + softplus(x_{t-1} + k_0) - softplus(x_{t-1} + k_1), x_{-1} = x0; with reverse the same
// backwards in time, x_t from x_{t+1} and x_T = x0.
// c (T, B, W), k (2, W), x0 (B, W) -> x (T, B, W).
Tensor softplus_scan(const Tensor& c, const Tensor& k, const Tensor& x0, bool reverse) {
  check_cpu_contiguous(c, "c"), check_cpu_contiguous(k, "k"), check_cpu_contiguous(x0, "x0");
  const int64_t T = c.size(0), W = c.size(2), N = c.size(1) * W;
  Tensor x = at::empty_like(c);
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), "softplus_scan", [&] {
    const scalar_t *cp = c.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *x0p = x0.data_ptr<scalar_t>();
    scalar_t* xp = x.data_ptr<scalar_t>();
    at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
      for_row_pieces(begin, end, W, [&](int64_t offset, int64_t w0, int64_t len) {
        for (int64_t i = 0; i < T; ++i) {
          const int64_t t = reverse ? T - 1 - i : i, before = reverse ? t + 1 : t - 1;
          const scalar_t* previous = i ? xp + before * N + offset : x0p + offset;
          const scalar_t* ct = cp + t * N + offset;
          scalar_t* xt = xp + t * N + offset;
          vec_for<scalar_t>(len, [&](int64_t j, int64_t n) {
            const auto v = load(previous + j, n);
            const auto k0 = load(kp + w0 + j, n), k1 = load(kp + W + w0 + j, n);
            (load(ct + j, n) + softplus_difference(v + k0, v + k1)).store(xt + j, n);
          });
        }
      });
    });
  });
  return x;
}

// Gradient of softplus_scan: with S_j = sigma(x_{t-1} + k_j) and D_t = S_0 - S_1,
// G_t = grad_t + D_{t+1} G_{t+1} is dL/dc_t; dL/dk_j = +-sum S_j G_t; dL/dx0 = D_0 G_0 (with
// reverse, t-1 and t+1 trade places).
// Returns (G (T, B, W), per-unit sums for k (2, B, W), summed over B by the caller, dL/dx0 (B, W)).
std::tuple<Tensor, Tensor, Tensor> softplus_scan_backward(const Tensor& grad, const Tensor& k, const Tensor& x0,
                                                          const Tensor& x, bool reverse) {
  check_cpu_contiguous(grad, "grad"), check_cpu_contiguous(k, "k"), check_cpu_contiguous(x0, "x0");
  check_cpu_contiguous(x, "x");
  const int64_t T = x.size(0), B = x.size(1), W = x.size(2), N = B * W;
  Tensor G = at::empty_like(x), grad_k = at::zeros({2, B, W}, x.options()), grad_x0 = at::empty_like(x0);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "softplus_scan_backward", [&] {
    const scalar_t *gp = grad.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *x0p = x0.data_ptr<scalar_t>(),
                   *xp = x.data_ptr<scalar_t>();
    scalar_t *Gp = G.data_ptr<scalar_t>(), *gkp = grad_k.data_ptr<scalar_t>(), *gx0p = grad_x0.data_ptr<scalar_t>();
    auto frame = [&](int64_t i) { return reverse ? T - 1 - i : i; };  // the i-th frame of the recursion
    at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
      for_row_pieces(begin, end, W, [&](int64_t offset, int64_t w0, int64_t len) {
        const int64_t last = frame(T - 1) * N + offset;
        std::copy(gp + last, gp + last + len, Gp + last);
        for (int64_t i = T - 1; i >= 0; --i) {
          const int64_t t = frame(i), before = i ? frame(i - 1) : 0;
          const scalar_t* previous = i ? xp + before * N + offset : x0p + offset;
          const scalar_t* g_t = Gp + t * N + offset;
          scalar_t* target = i ? Gp + before * N + offset : gx0p + offset;  // G_{t-1}, or dL/dx0
          vec_for<scalar_t>(len, [&](int64_t j, int64_t n) {
            const auto v = load(previous + j, n), g = load(g_t + j, n);
            const auto s0 = sigmoid(v + load(kp + w0 + j, n)), s1 = sigmoid(v + load(kp + W + w0 + j, n));
            (load(gkp + offset + j, n) + s0 * g).store(gkp + offset + j, n);
            (load(gkp + N + offset + j, n) - s1 * g).store(gkp + N + offset + j, n);
            auto following = (s0 - s1) * g;
            if (i) following = following + load(gp + before * N + offset + j, n);
            following.store(target + j, n);
          });
        }
      });
    });
  });
  return {G, grad_k, grad_x0};
}

// The UBRU Kalman smoother, eq. 21 as the affine recursion of fast.paths._kalman: with
// S_j = sigma(x_t + k_j), gamma_t = (S_0 - S_1) gamma_{t+1} + S_1 before a sequence's last frame, and
// gamma_t = sigma(x_t) = alpha_t from it on (the last frame, and padding).
// x (T, B, H) = logit alpha, k (2, H), last (B,) int64 = length - 1 -> gamma (T, B, H).
Tensor kalman_smoother(const Tensor& x, const Tensor& k, const Tensor& last) {
  check_cpu_contiguous(x, "x"), check_cpu_contiguous(k, "k"), check_cpu_contiguous(last, "last");
  TORCH_CHECK(last.scalar_type() == at::kLong, "kalman_smoother: last must be int64");
  const int64_t T = x.size(0), H = x.size(2), N = x.size(1) * H;
  Tensor gamma = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kalman_smoother", [&] {
    const scalar_t *xp = x.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>();
    const int64_t* lp = last.data_ptr<int64_t>();
    scalar_t* gp = gamma.data_ptr<scalar_t>();
    at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
      for_row_pieces(begin, end, H, [&](int64_t offset, int64_t w0, int64_t len) {
        const int64_t end_frame = lp[offset / H];
        for (int64_t t = T - 1; t >= 0; --t) {
          const scalar_t* xt = xp + t * N + offset;
          scalar_t* gt = gp + t * N + offset;
          vec_for<scalar_t>(len, [&](int64_t j, int64_t n) {
            const auto v = load(xt + j, n);
            if (t >= end_frame) return sigmoid(v).store(gt + j, n);
            const auto s0 = sigmoid(v + load(kp + w0 + j, n)), s1 = sigmoid(v + load(kp + H + w0 + j, n));
            at::vec::fmadd(s0 - s1, load(gt + N + j, n), s1).store(gt + j, n);
          });
        }
      });
    });
  });
  return gamma;
}

// Gradient of kalman_smoother. The transposed recursion runs forward in time:
// G_t = dL/dgamma_t + A_{t-1} G_{t-1} (A = S_0 - S_1, 0 from the last frame on); then
// dL/dA_t = G_t gamma_{t+1} and dL/dS_1 = G_t - dL/dA_t, through sigma' to x and k.
// Returns dL/dx (T, B, H) and per-unit sums for k (2, B, H), summed over B by the caller.
std::tuple<Tensor, Tensor> kalman_smoother_backward(const Tensor& grad, const Tensor& x, const Tensor& k,
                                                    const Tensor& last, const Tensor& gamma) {
  check_cpu_contiguous(grad, "grad"), check_cpu_contiguous(x, "x"), check_cpu_contiguous(k, "k");
  check_cpu_contiguous(last, "last"), check_cpu_contiguous(gamma, "gamma");
  const int64_t T = x.size(0), B = x.size(1), H = x.size(2), N = B * H;
  Tensor grad_x = at::empty_like(x), grad_k = at::zeros({2, B, H}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kalman_smoother_backward", [&] {
    using V = Vec<scalar_t>;
    const scalar_t *dgp = grad.data_ptr<scalar_t>(), *xp = x.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(),
                   *gp = gamma.data_ptr<scalar_t>();
    const int64_t* lp = last.data_ptr<int64_t>();
    scalar_t *dxp = grad_x.data_ptr<scalar_t>(), *dkp = grad_k.data_ptr<scalar_t>();
    const V one(scalar_t(1));
    at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> carried(end - begin);  // A_{t-1} G_{t-1} of each unit
      for_row_pieces(begin, end, H, [&](int64_t offset, int64_t w0, int64_t len) {
        const int64_t end_frame = lp[offset / H];
        scalar_t* AG = carried.data() + (offset - begin);
        std::fill(AG, AG + len, scalar_t(0));
        for (int64_t t = 0; t < T; ++t) {
          const int64_t here = t * N + offset;
          vec_for<scalar_t>(len, [&](int64_t j, int64_t n) {
            const auto v = load(xp + here + j, n), G = load(dgp + here + j, n) + load(AG + j, n);
            if (t >= end_frame) {  // gamma_t = sigma(x_t); nothing flows on to t + 1
              const auto s = sigmoid(v);
              (G * s * (one - s)).store(dxp + here + j, n);
              V(scalar_t(0)).store(AG + j, n);
              return;
            }
            const auto s0 = sigmoid(v + load(kp + w0 + j, n)), s1 = sigmoid(v + load(kp + H + w0 + j, n));
            const auto dA = G * load(gp + here + N + j, n), dS1 = G - dA;
            const auto d0 = dA * s0 * (one - s0), d1 = dS1 * s1 * (one - s1);
            (d0 + d1).store(dxp + here + j, n);
            (load(dkp + offset + j, n) + d0).store(dkp + offset + j, n);
            (load(dkp + N + offset + j, n) + d1).store(dkp + N + offset + j, n);
            ((s0 - s1) * G).store(AG + j, n);
          });
        }
      });
    });
  });
  return {grad_x, grad_k};
}

// ---------------------------------------------------------------------------------------------
// Cells with a recurrent matrix (models/fast/gated.py; their TorchScript mirrors in models/fast/loops.py).
//
// With B of 8-32 sequences the per-step product h_{t-1} @ W is a GEMM of a few rows, which a
// multi-threaded BLAS call barely speeds up, and the elementwise step after it is too small to
// split. So the threads split the hidden units instead, for the whole time loop: each thread
// multiplies by its own columns of every gate (a copy of W reordered into one block per thread),
// runs the elementwise step for its own units straight away, and waits once per step for the
// others (the next product needs all of h_t).

// The Fortran BLAS that libtorch itself calls (MKL on x86-64 builds). Weak, so that a torch build
// without it still loads this extension and takes the ATen route in gemm().
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*, const int*,
            const double*, const int*, const double*, double*, const int*) __attribute__((weak));
}

// Column-major C (m, n) = A (m, k) B (k, n) + beta C, single-threaded when called from a thread of a
// parallel region (BLAS runs nested calls sequentially).
template <typename T>
void gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
          int64_t ldc) {
  const int mi = m, ni = n, ki = k, ldai = lda, ldbi = ldb, ldci = ldc;
  const T one(1);
#ifndef BRU_KALDI_ATEN_GEMM  // defined only to check the ATen route on a machine that has the BLAS
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm_) return sgemm_("N", "N", &mi, &ni, &ki, &one, a, &ldai, b, &ldbi, &beta, c, &ldci);
  } else {
    if (dgemm_) return dgemm_("N", "N", &mi, &ni, &ki, &one, a, &ldai, b, &ldbi, &beta, c, &ldci);
  }
#endif
  // row-major: C^T (n, m) = B^T (n, k) A^T (k, m)
  const auto options = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  at::Tensor ct = at::from_blob(c, {n, m}, {ldc, 1}, options);
  ct.addmm_(at::from_blob(const_cast<T*>(b), {n, k}, {ldb, 1}, options),
            at::from_blob(const_cast<T*>(a), {k, m}, {lda, 1}, options), beta, 1);
}

// MKL's packed GEMM (float only; weak, like sgemm_): A packed once into the BLAS's own layout, then
// multiplied many times.
extern "C" {
size_t sgemm_pack_get_size_(const char*, const int*, const int*, const int*) __attribute__((weak));
void sgemm_pack_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
                 float*) __attribute__((weak));
void sgemm_compute_(const char*, const char*, const int*, const int*, const int*, const float*, const int*,
                    const float*, const int*, const float*, float*, const int*) __attribute__((weak));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#ifdef BRU_KALDI_PANEL_PRODUCT
// Our own small-product kernel, for the AVX2 build. Why by hand: with the batch (8-32 sequences) as the
// product's few columns, MKL's packed GEMM reached 37-64 GFLOP/s on one core of an AMD EPYC (AVX2), this
// kernel 61-92 (2026-11-26, shapes 128-384 by 8-16 by 256-1024, one thread, four runs; RESULTS.md): the
// BLAS is tuned for large products. A is packed once into panels of 24 rows (three 8-float vectors), each
// stored as k rows of 24 contiguous floats; a panel times up to 4 columns of B keeps its 24 x 4 results in
// 12 vector registers for the whole sum over k. Each panel is used for every column of B before the next
// one is read, so A streams once per product. The sums run in order over k, like any dot product: results
// differ from the BLAS's only in rounding. (The AVX-512 build keeps MKL: it was not measured against it.)
constexpr int64_t kPanel = 24;

// C[:, j] = beta C[:, j] + value for the 24 rows of a panel (fewer in A's last panel, whose padding
// rows are not C's).
inline void store_panel_column(const __m256* value, float beta, float* column, int64_t rows) {
  if (rows == kPanel) {
    for (int v = 0; v < 3; ++v) {
      __m256 sum = value[v];
      if (beta != 0.f) sum = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_loadu_ps(column + 8 * v), sum);
      _mm256_storeu_ps(column + 8 * v, sum);
    }
    return;
  }
  alignas(32) float part[kPanel];
  for (int v = 0; v < 3; ++v) _mm256_store_ps(part + 8 * v, value[v]);
  for (int64_t i = 0; i < rows; ++i) column[i] = part[i] + (beta != 0.f ? beta * column[i] : 0.f);
}

// C[0:rows, 0:4] = panel (k rows of 24) times B[0:k, 0:4] + beta C; column-major B (ldb), C (ldc).
// Written out: with the four columns in a loop, even unrolled, GCC kept the sums in memory (3x slower).
inline void panel_times_4(int64_t k, const float* panel, const float* b, int64_t ldb, float beta, float* c,
                          int64_t ldc, int64_t rows) {
  __m256 s00 = _mm256_setzero_ps(), s01 = s00, s02 = s00, s10 = s00, s11 = s00, s12 = s00;
  __m256 s20 = s00, s21 = s00, s22 = s00, s30 = s00, s31 = s00, s32 = s00;
  const float *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
  for (int64_t p = 0; p < k; ++p, panel += kPanel) {
    const __m256 a0 = _mm256_load_ps(panel), a1 = _mm256_load_ps(panel + 8), a2 = _mm256_load_ps(panel + 16);
    __m256 x = _mm256_broadcast_ss(b0 + p);
    s00 = _mm256_fmadd_ps(a0, x, s00), s01 = _mm256_fmadd_ps(a1, x, s01), s02 = _mm256_fmadd_ps(a2, x, s02);
    x = _mm256_broadcast_ss(b1 + p);
    s10 = _mm256_fmadd_ps(a0, x, s10), s11 = _mm256_fmadd_ps(a1, x, s11), s12 = _mm256_fmadd_ps(a2, x, s12);
    x = _mm256_broadcast_ss(b2 + p);
    s20 = _mm256_fmadd_ps(a0, x, s20), s21 = _mm256_fmadd_ps(a1, x, s21), s22 = _mm256_fmadd_ps(a2, x, s22);
    x = _mm256_broadcast_ss(b3 + p);
    s30 = _mm256_fmadd_ps(a0, x, s30), s31 = _mm256_fmadd_ps(a1, x, s31), s32 = _mm256_fmadd_ps(a2, x, s32);
  }
  const __m256 c0[3] = {s00, s01, s02}, c1[3] = {s10, s11, s12}, c2[3] = {s20, s21, s22}, c3[3] = {s30, s31, s32};
  store_panel_column(c0, beta, c, rows);
  store_panel_column(c1, beta, c + ldc, rows);
  store_panel_column(c2, beta, c + 2 * ldc, rows);
  store_panel_column(c3, beta, c + 3 * ldc, rows);
}

// The same for one column (the last columns of B when their number is not a multiple of 4).
inline void panel_times_1(int64_t k, const float* panel, const float* b, float beta, float* c, int64_t rows) {
  __m256 s[3] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t p = 0; p < k; ++p, panel += kPanel) {
    const __m256 x = _mm256_broadcast_ss(b + p);
    s[0] = _mm256_fmadd_ps(_mm256_load_ps(panel), x, s[0]);
    s[1] = _mm256_fmadd_ps(_mm256_load_ps(panel + 8), x, s[1]);
    s[2] = _mm256_fmadd_ps(_mm256_load_ps(panel + 16), x, s[2]);
  }
  store_panel_column(s, beta, c, rows);
}
#endif

// A product that every time step repeats with the same left operand: column-major C (m, n) = A (m, k)
// B (k, n) + beta C for a fixed A (a thread's block of the recurrent matrix). Each GEMM call repacks A
// into the BLAS's internal layout, which for the few columns of B here (the batch) costs about as much
// as the multiplication, so A is packed once per time loop: into our panels (float, AVX2 build, above),
// else into MKL's packed GEMM layout. Where neither applies (float64, another BLAS) it is gemm() itself.
template <typename T>
class StepProduct {
 public:
  StepProduct(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda) : m_(m), n_(n), k_(k), a_(a), lda_(lda) {
    if (m <= 0 || n <= 0 || k <= 0) return;
    if constexpr (std::is_same_v<T, float>) {
#ifdef BRU_KALDI_PANEL_PRODUCT
      const int64_t panels = ceil_div(m, kPanel);  // aligned_alloc wants a size that is a multiple of 64
      panels_.reset(static_cast<float*>(std::aligned_alloc(64, ceil_div(panels * kPanel * k * int64_t(sizeof(float)), 64) * 64)));
      if (panels_) {
        for (int64_t q = 0; q < panels; ++q) {
          float* panel = panels_.get() + q * kPanel * k;
          const int64_t rows = std::min(kPanel, m - q * kPanel);
          for (int64_t p = 0; p < k; ++p) {
            const float* column = a + p * lda + q * kPanel;
            std::copy(column, column + rows, panel + p * kPanel);
            std::fill(panel + p * kPanel + rows, panel + (p + 1) * kPanel, 0.f);
          }
        }
        return;
      }
#endif
#ifndef BRU_KALDI_ATEN_GEMM
      if (sgemm_pack_get_size_ && sgemm_pack_ && sgemm_compute_) {
        const int mi = m, ni = n, ki = k, ldai = lda;
        const float one = 1;
        const size_t bytes = sgemm_pack_get_size_("A", &mi, &ni, &ki);
        packed_.reset(static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
        if (packed_) sgemm_pack_("A", "N", &mi, &ni, &ki, &one, a, &ldai, packed_.get());
      }
#endif
    }
  }

  void operator()(const T* b, int64_t ldb, T beta, T* c, int64_t ldc) const {
    if constexpr (std::is_same_v<T, float>) {
#ifdef BRU_KALDI_PANEL_PRODUCT
      if (panels_) {
        for (int64_t q = 0; q * kPanel < m_; ++q) {
          const float* panel = panels_.get() + q * kPanel * k_;
          const int64_t rows = std::min(kPanel, m_ - q * kPanel);
          int64_t j = 0;
          for (; j + 4 <= n_; j += 4)
            panel_times_4(k_, panel, b + j * ldb, ldb, beta, c + j * ldc + q * kPanel, ldc, rows);
          for (; j < n_; ++j) panel_times_1(k_, panel, b + j * ldb, beta, c + j * ldc + q * kPanel, rows);
        }
        return;
      }
#endif
      if (packed_) {
        const int mi = m_, ni = n_, ki = k_, ldbi = ldb, ldci = ldc;
        return sgemm_compute_("P", "N", &mi, &ni, &ki, packed_.get(), &mi, b, &ldbi, &beta, c, &ldci);
      }
    }
    gemm<T>(m_, n_, k_, a_, lda_, b, ldb, beta, c, ldc);
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  int64_t m_, n_, k_;
  const T* a_;
  int64_t lda_;
  std::unique_ptr<float, Free> packed_, panels_;
};

constexpr int64_t kMinUnitsPerThread = 16;

// Threads worth using for H units; each gets whole vectors of units.
int planned_threads(int64_t H) {
  const int64_t most = std::max<int64_t>(1, H / kMinUnitsPerThread);
  return static_cast<int>(std::min<int64_t>(at::get_num_threads(), most));
}

// Units [begin, end) of thread `tid` among `threads` (possibly empty for the last threads).
template <typename T>
std::pair<int64_t, int64_t> own_units(int64_t H, int tid, int threads) {
  const int64_t chunk = ceil_div(ceil_div(H, threads), Vec<T>::size()) * Vec<T>::size();
  const int64_t begin = std::min(H, tid * chunk);
  return {begin, std::min(H, begin + chunk)};
}

// Forward time loop of a layer with G gates: for t = 0..T-1, U = h_{t-1} @ weight_t restricted to
// the calling thread's units, then step(t, u0, u1, U, ldu, 0) writes h_t (out[t]) for units [u0, u1),
// reading gate g of unit j at U[b * ldu + g * (u1 - u0) + j - u0]. weight_t (H, G*H), h0 (B, H),
// out (T, B, H).
// The last `inner` gates may multiply another vector than h_{t-1} (MGU: U_h (f * h_{t-1})): then
// step(..., 0) writes that vector to mid (B, H) for its units, and after a barrier those gates' part
// of U is mid @ weight_t and step(..., 1) writes h_t: one barrier a step more, for those units only.
template <typename T, typename Step>
void forward_loop(int64_t steps, int64_t B, int64_t H, int64_t gates, int64_t inner, const T* weight_t, const T* h0,
                  const T* out, const T* mid, const Step& step) {
  std::vector<T> packed(H * gates * H), scratch(B * gates * H);
#pragma omp parallel num_threads(planned_threads(H))
  {
    const int threads = omp_get_num_threads(), tid = omp_get_thread_num();
    const auto [u0, u1] = own_units<T>(H, tid, threads);
    const int64_t n = u1 - u0, ld = gates * n, outer = gates - inner;
    T* block = packed.data() + H * gates * u0;  // (H, G*n): this thread's columns of every gate
    T* U = scratch.data() + B * gates * u0;     // (B, G*n)
    for (int64_t i = 0; i < H; ++i)
      for (int64_t g = 0; g < gates; ++g)
        std::copy(weight_t + i * gates * H + g * H + u0, weight_t + i * gates * H + g * H + u1, block + i * ld + g * n);
    // row-major U = h_{t-1} @ block is column-major U^T = block^T h_{t-1}^T
    const StepProduct<T> product(outer * n, B, H, block, ld), inner_product(inner * n, B, H, block + outer * n, ld);
    for (int64_t t = 0; t < steps; ++t) {
      if (n > 0) {
        product(t ? out + (t - 1) * B * H : h0, H, T(0), U, ld);
        step(t, u0, u1, U, ld, 0);
      }
      if (inner) {  // the same for every thread
#pragma omp barrier
        if (n > 0) {
          inner_product(mid, H, T(0), U + outer * n, ld);
          step(t, u0, u1, U, ld, 1);
        }
      }
#pragma omp barrier
    }
  }
}

// Backward time loop: for t = T-1..0, step(t, u0, u1, g_t, g_previous, 0) fills the rows du[t] of the
// calling thread's units (every gate) and sets g_previous[:, u0:u1] to what reaches h_{t-1} other
// than through W; then g_{t-1} = g_previous + du[t] @ weight. weight (width, H), du (T, B, width),
// g_last = dL/dh_{T-1} (B, H). Writes dL/dh_{-1} (B, H) to grad_h0.
// With `inner` gates (see forward_loop) step(..., 0) fills only their rows of du[t]; after a barrier
// mid[:, u0:u1] = du[t][inner gates] @ weight[inner gates][:, u0:u1], the gradient of the vector they
// multiply, and step(..., 1) fills the other rows and g_previous.
template <typename T, typename Step>
void backward_loop(int64_t steps, int64_t B, int64_t H, int64_t width, int64_t inner, const T* weight, T* du,
                   const T* g_last, T* grad_h0, T* mid, const Step& step) {
  std::vector<T> turns(2 * B * H);
  auto slot = [&](int64_t t) -> T* {  // where g_t lives, t = -1 .. T-1: two buffers in turn
    return t < 0 ? grad_h0 : turns.data() + (t % 2) * B * H;
  };
  std::copy(g_last, g_last + B * H, slot(steps - 1));
  const int64_t outer = width - inner * H;  // columns of du that multiply h_{t-1}
#pragma omp parallel num_threads(planned_threads(H))
  {
    const int threads = omp_get_num_threads(), tid = omp_get_thread_num();
    const auto [u0, u1] = own_units<T>(H, tid, threads);
    // previous[:, u0:u1] += du[t] @ weight[:, u0:u1] is column-major W_block^T du^T
    const StepProduct<T> product(u1 - u0, B, outer, weight + u0, H),
        inner_product(u1 - u0, B, inner * H, weight + outer * H + u0, H);
    for (int64_t t = steps - 1; t >= 0; --t) {
      T* previous = slot(t - 1);
      T* rows = du + t * B * width;
      if (u1 > u0) step(t, u0, u1, slot(t), previous, 0);
      if (inner) {
#pragma omp barrier
        if (u1 > u0) {
          inner_product(rows + outer, width, T(0), mid + u0, H);
          step(t, u0, u1, slot(t), previous, 1);
        }
      }
#pragma omp barrier
      if (u1 > u0) product(rows, width, T(1), previous + u0, H);
      // No second barrier: the next step reads only this thread's units of g, and writes rows du[t-1].
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The units of the gated family, each described by its elementwise step: a struct with its number
// of gates (columns of proj, rows of W, in the cell's order), how many values per unit and frame it
// keeps for backward, its `forward` (h_t from the gates' inputs) and `backward` (the gradients of the
// gates' pre-activations from dL/dh_t, and what reaches h_{t-1} other than through W). What differs
// from one unit to the next is only there; the drivers below (unit_forward, unit_backward) run every
// unit through forward_loop / backward_loop. Flags, false unless a unit sets them:
//   kCell    a second state per unit, c (LSTM), carried forward and its gradient backward;
//   kInner   1 when the last gate multiplies its own vector, not h_{t-1} (MGU: U_h (f * h_{t-1}));
//   kScaled  the last gate's product U h + b is scaled before it meets the projection (GRU's reset
//            gate on U_n h + b_hn), so the projection's gradient of that gate, dq, differs from du's;
//   kMasked  the unit takes a candidate mask m (B, H), pytorch-kaldi's inner dropout (models.gated.
//            InnerDropout): its candidate is multiplied by m[b] in forward (x.dropped) and the candidate's
//            derivative by the same m[b] in backward. Without a mask (nullptr) the unit is unchanged.

// One vector of units [j, j + m) of sequence b at frame t, forward.
template <typename T>
struct ForwardLane {
  const T* p;        // proj[t, b] at unit j: gate g at p[g * H]
  const T* u;        // this thread's product U[b] at unit j: gate g at u[g * n]
  const T* bias;     // b_hh at unit j (gate g at bias[g * H]), or nullptr
  const T* h;        // h_{t-1}[b] at unit j
  const T* c;        // kCell: c_{t-1}[b] at unit j, nullptr at t = 0 (c_{-1} = 0)
  T* c_next;         // kCell: c_t[b] at unit j
  T* kept;           // kept[t, b] at unit j: value k at kept[k * H]; nullptr when nothing is kept
  T* mid;            // kInner: the vector the last gate multiplies, [b] at unit j
  const T* mask;     // kMasked: the candidate mask [b] at unit j, or nullptr (no inner dropout)
  int64_t H, n, m;   // the gate strides of p and u; the vector's length

  Vec<T> product(int64_t g) const {  // U_g h_{t-1} + b_g
    const auto v = load(u + g * n, m);
    return bias ? v + load(bias + g * H, m) : v;
  }
  Vec<T> proj(int64_t g) const { return load(p + g * H, m); }
  Vec<T> pre(int64_t g) const { return proj(g) + product(g); }
  Vec<T> previous() const { return load(h, m); }
  void keep(int64_t k, const Vec<T>& v) const {
    if (kept) v.store(kept + k * H, m);
  }
  Vec<T> dropped(const Vec<T>& v) const { return mask ? v * load(mask, m) : v; }  // the candidate times m
};

// The same vector of units, backward.
template <typename T>
struct BackwardLane {
  Vec<T> g;          // dL/dh_t, everything included
  const T* kept;     // kept[t, b] at unit j
  const T* out;      // h_t[b] at unit j
  const T* h;        // h_{t-1}[b] at unit j
  const T* c;        // kCell: c_t and c_{t-1} at unit j (c_before nullptr at t = 0)
  const T* c_before;
  T* dc;             // kCell: dL/dc_t from frame t + 1 in, dL/dc_{t-1} out
  T* du;             // du[t, b] at unit j: gate g at du[g * H]
  T* dq;             // kScaled: dq[t, b] at unit j
  const T* mid;      // kInner: the gradient of the vector the last gate multiplies
  T* dbias;          // the sum of du over frames and sequences so far, at unit j, or nullptr
  const T* mask;     // kMasked: the candidate mask [b] at unit j, or nullptr
  int64_t H, m;

  Vec<T> saved(int64_t k) const { return load(kept + k * H, m); }
  Vec<T> previous() const { return load(h, m); }
  Vec<T> dropped(const Vec<T>& v) const { return mask ? v * load(mask, m) : v; }
  void grad(int64_t gate, const Vec<T>& v) const {
    v.store(du + gate * H, m);
    if (dbias) (load(dbias + gate * H, m) + v).store(dbias + gate * H, m);
  }
};

template <typename T>
inline Vec<T> sigmoid_derivative(const Vec<T>& s) {  // from sigma(a)
  return s * (Vec<T>(T(1)) - s);
}

template <typename T>
inline Vec<T> tanh_derivative(const Vec<T>& y) {  // from tanh(a)
  return Vec<T>(T(1)) - y * y;
}

struct Unit {  // the defaults
  static constexpr int64_t kKept = 0, kInner = 0;
  static constexpr bool kCell = false, kScaled = false, kMasked = false;
};

// BRU, eq. 6: log h_t = log sigma(a). Keeps nothing: d log sigma(a) / da = 1 - sigma(a) = -expm1(log h_t).
struct BRU : Unit {
  static constexpr int64_t kGates = 1;
  template <typename T>
  static Vec<T> forward(const ForwardLane<T>& x) { return log_sigmoid(x.pre(0)); }
  template <typename T>
  static Vec<T> backward(const BackwardLane<T>& x) {
    x.grad(0, x.g * load(x.out, x.m).expm1().neg());
    return Vec<T>(T(0));
  }
};

// Li-BRU, eq. 7c in log space, gates [z, h~]: log h_t = log z + logaddexp(log h~, d), d = log h_{t-1} - a_z,
// as log(1 - z) = log z - a_z. The derivatives are ratios of terms of h_t = z h~ + (1 - z) h_{t-1}:
// with w = z h~ / h_t (the new candidate's weight), dlog h_t / da_z = w - z, dlog h_t / da_h = w (1 - h~),
// dlog h_t / dlog h_{t-1} = (1 - z) h_{t-1} / h_t = 1 - w. Forward has every exp they need: with
// e = exp(-|log h~ - d|) (logaddexp's own), w and 1 - w are 1 / (1 + e) and e / (1 + e), the larger
// term's first; z and 1 - h~ come from exp(-|a|) the same way. So forward keeps [w, 1 - w, z, 1 - h~]
// (each formed as a ratio, never as 1 minus another: exact where it is tiny) and backward computes no
// exp or log: 5 transcendental functions a step instead of 10. log z and logaddexp's log1p are one log of
// a ratio (as softplus_difference).
struct LiBRU : Unit {
  static constexpr int64_t kGates = 2, kKept = 4;
  template <typename T>
  static Vec<T> forward(const ForwardLane<T>& x) {
    const Vec<T> zero(T(0)), one(T(1));
    const auto a_z = x.pre(0), a_c = x.pre(1), d = x.previous() - a_z;
    const auto e_z = a_z.abs().neg().exp(), e_c = a_c.abs().neg().exp();
    const auto r_z = one / (one + e_z), r_c = one / (one + e_c);
    const auto log_c = at::vec::minimum(a_c, zero) - e_c.log1p();
    const auto e = (log_c - d).abs().neg().exp(), r = one / (one + e);
    const auto candidate_larger = log_c >= d;
    x.keep(0, Vec<T>::blendv(e * r, r, candidate_larger));    // w
    x.keep(1, Vec<T>::blendv(r, e * r, candidate_larger));    // 1 - w
    x.keep(2, Vec<T>::blendv(e_z * r_z, r_z, a_z >= zero));  // z
    x.keep(3, Vec<T>::blendv(r_c, e_c * r_c, a_c >= zero));  // 1 - h~
    // log z + max(log h~, d) + log1p(e), log z = min(a_z, 0) - log1p(e_z)
    return at::vec::minimum(a_z, zero) + at::vec::maximum(log_c, d) + ((one + e) * r_z).log();
  }
  template <typename T>
  static Vec<T> backward(const BackwardLane<T>& x) {
    const auto w = x.saved(0);
    x.grad(0, x.g * (w - x.saved(2)));
    x.grad(1, x.g * w * x.saved(3));
    return x.g * x.saved(1);
  }
};

// Li-GRU, eq. 8, gates [z, h~]: h_t = h_{t-1} + z (m relu(a_h) - h_{t-1}), m the candidate mask (1
// without one). Keeps the pre-activations.
struct LiGRU : Unit {
  static constexpr int64_t kGates = 2, kKept = 2;
  static constexpr bool kMasked = true;
  template <typename T>
  static Vec<T> forward(const ForwardLane<T>& x) {
    const auto a_z = x.pre(0), a_h = x.pre(1), h = x.previous();
    x.keep(0, a_z), x.keep(1, a_h);
    return at::vec::fmadd(sigmoid(a_z), x.dropped(at::vec::maximum(a_h, Vec<T>(T(0)))) - h, h);
  }
  template <typename T>
  static Vec<T> backward(const BackwardLane<T>& x) {
    const Vec<T> zero(T(0)), one(T(1));
    const auto a_h = x.saved(1), z = sigmoid(x.saved(0));
    x.grad(0, x.g * (x.dropped(at::vec::maximum(a_h, zero)) - x.previous()) * sigmoid_derivative(z));
    x.grad(1, x.dropped(x.g * Vec<T>::blendv(zero, z, a_h > zero)));
    return x.g * (one - z);
  }
};

// Elman RNN, h_t = m tanh(a) or m relu(a), m the candidate mask (1 without one). Keeps nothing: both
// derivatives come from h_t and m (relu's is 0 at 0, as torch's). With a mask, tanh's is
// m (1 - tanh^2 a) = m - h_t^2 / m, which is 0 where m is (h_t is 0 there too).
struct RNNTanh : Unit {
  static constexpr int64_t kGates = 1;
  static constexpr bool kMasked = true;
  template <typename T>
  static Vec<T> forward(const ForwardLane<T>& x) { return x.dropped(fast_tanh(x.pre(0))); }
  template <typename T>
  static Vec<T> backward(const BackwardLane<T>& x) {
    const auto h = load(x.out, x.m);
    if (!x.mask) {
      x.grad(0, x.g * tanh_derivative(h));
    } else {
      const Vec<T> zero(T(0)), one(T(1));
      const auto m = load(x.mask, x.m), safe = Vec<T>::blendv(m, one, m == zero);
      x.grad(0, x.g * (m - h * h / safe));
    }
    return Vec<T>(T(0));
  }
};

struct RNNReLU : Unit {
  static constexpr int64_t kGates = 1;
  static constexpr bool kMasked = true;
  template <typename T>
  static Vec<T> forward(const ForwardLane<T>& x) { return x.dropped(at::vec::maximum(x.pre(0), Vec<T>(T(0)))); }
  template <typename T>
  static Vec<T> backward(const BackwardLane<T>& x) {  // h_t > 0 exactly where a > 0 and m > 0
    const Vec<T> zero(T(0));
    x.grad(0, Vec<T>::blendv(zero, x.dropped(x.g), load(x.out, x.m) > zero));
    return zero;
  }
};

// GRU in PyTorch's convention, gates [r, z, n]: n = tanh(p_n + r e) with e = U_n h_{t-1} + b_hn,
// h_t = m n + z (h_{t-1} - m n), m the candidate mask (1 without one). Keeps [r, z, n, e], n undropped.
struct GRU : Unit {
  static constexpr int64_t kGates = 3, kKept = 4;
  static constexpr bool kScaled = true, kMasked = true;
  template <typename T>
  static Vec<T> forward(const ForwardLane<T>& x) {
    const auto r = sigmoid(x.pre(0)), z = sigmoid(x.pre(1)), e = x.product(2);
    const auto n = fast_tanh(at::vec::fmadd(r, e, x.proj(2))), candidate = x.dropped(n);
    x.keep(0, r), x.keep(1, z), x.keep(2, n), x.keep(3, e);
    return at::vec::fmadd(z, x.previous() - candidate, candidate);
  }
  template <typename T>
  static Vec<T> backward(const BackwardLane<T>& x) {
    const Vec<T> one(T(1));
    const auto r = x.saved(0), z = x.saved(1), n = x.saved(2), e = x.saved(3);
    const auto dq = x.dropped(x.g * (one - z) * tanh_derivative(n));  // of p_n + r e
    dq.store(x.dq, x.m);
    x.grad(0, dq * e * sigmoid_derivative(r));
    x.grad(1, x.g * (x.previous() - x.dropped(n)) * sigmoid_derivative(z));
    x.grad(2, dq * r);  // of e
    return x.g * z;
  }
};

// LSTM in PyTorch's convention, gates [i, f, g, o]: c_t = f c_{t-1} + i m g, h_t = o tanh(c_t), c_{-1} = 0,
// m the candidate mask (1 without one). Keeps the gate values (g undropped), and c_t (tanh(c_t) is
// recomputed backward).
struct LSTM : Unit {
  static constexpr int64_t kGates = 4, kKept = 4;
  static constexpr bool kCell = true, kMasked = true;
  template <typename T>
  static Vec<T> forward(const ForwardLane<T>& x) {
    const auto i = sigmoid(x.pre(0)), f = sigmoid(x.pre(1)), g = fast_tanh(x.pre(2)), o = sigmoid(x.pre(3));
    const auto c = x.c ? at::vec::fmadd(f, load(x.c, x.m), i * x.dropped(g)) : i * x.dropped(g);
    c.store(x.c_next, x.m);
    x.keep(0, i), x.keep(1, f), x.keep(2, g), x.keep(3, o);
    return o * fast_tanh(c);
  }
  template <typename T>
  static Vec<T> backward(const BackwardLane<T>& x) {
    const auto i = x.saved(0), f = x.saved(1), g = x.saved(2), o = x.saved(3), tc = fast_tanh(load(x.c, x.m));
    const auto dc = at::vec::fmadd(x.g * o, tanh_derivative(tc), load(x.dc, x.m));
    x.grad(0, dc * x.dropped(g) * sigmoid_derivative(i));
    x.grad(1, x.c_before ? dc * load(x.c_before, x.m) * sigmoid_derivative(f) : Vec<T>(T(0)));
    x.grad(2, x.dropped(dc * i * tanh_derivative(g)));
    x.grad(3, x.g * tc * sigmoid_derivative(o));
    (dc * f).store(x.dc, x.m);
    return Vec<T>(T(0));
  }
};

// Minimal gated unit, gates [f, h~]: s = f h_{t-1}, h~ = tanh(p_h + U_h s), h_t = h_{t-1} + f (h~ - h_{t-1}).
// The candidate's product needs all of s, hence kInner: `inner` writes s, `forward` runs after the
// barrier (and recomputes f, one sigmoid, rather than keep it per thread). Keeps [f, h~].
struct MGU : Unit {
  static constexpr int64_t kGates = 2, kKept = 2, kInner = 1;
  template <typename T>
  static void inner(const ForwardLane<T>& x) {
    const auto f = sigmoid(x.pre(0));
    (f * x.previous()).store(x.mid, x.m);
    x.keep(0, f);
  }
  template <typename T>
  static Vec<T> forward(const ForwardLane<T>& x) {
    const auto f = sigmoid(x.pre(0)), c = fast_tanh(x.pre(1)), h = x.previous();
    x.keep(1, c);
    return at::vec::fmadd(f, c - h, h);
  }
  template <typename T>
  static void backward_inner(const BackwardLane<T>& x) {  // da_h, whose product gives dL/ds (mid)
    x.grad(1, x.g * x.saved(0) * tanh_derivative(x.saved(1)));
  }
  template <typename T>
  static Vec<T> backward(const BackwardLane<T>& x) {
    const Vec<T> one(T(1));
    const auto f = x.saved(0), c = x.saved(1), h = x.previous(), ds = load(x.mid, x.m);
    x.grad(0, at::vec::fmadd(x.g, c - h, ds * h) * sigmoid_derivative(f));
    return at::vec::fmadd(x.g, one - f, ds * f);
  }
};

// The one table that ties a unit's name, as the Python fast paths pass it (models.UNITS; rnn_tanh and
// rnn_relu for the rnn's two activations), to its step: callers pass the name, never a number that
// depends on the order of a list.
template <typename F>
auto with_unit(c10::string_view unit, const F& f) {
  if (unit == "bru") return f(BRU{});
  if (unit == "libru") return f(LiBRU{});
  if (unit == "ligru") return f(LiGRU{});
  if (unit == "gru") return f(GRU{});
  if (unit == "lstm") return f(LSTM{});
  if (unit == "mgu") return f(MGU{});
  if (unit == "rnn_tanh") return f(RNNTanh{});
  if (unit == "rnn_relu") return f(RNNReLU{});
  TORCH_CHECK(false, "no fused kernel for unit '", std::string(unit),
              "' (bru, libru, ligru, gru, lstm, mgu, rnn_tanh, rnn_relu)");
}

// The candidate mask's checks, shared by both directions: empty, or (B, H) for a unit that takes one.
template <typename K>
void check_mask(const Tensor& mask, int64_t B, int64_t H, const char* op) {
  TORCH_CHECK(mask.numel() == 0 || K::kMasked, op, ": this unit has no candidate to mask (inner dropout: ligru, "
              "gru, lstm, rnn_tanh, rnn_relu)");
  TORCH_CHECK(mask.numel() == 0 || (mask.dim() == 2 && mask.size(0) == B && mask.size(1) == H), op,
              ": the candidate mask must be empty or (B, H) = (", text(B), ", ", text(H), ")");
}

// The forward pass of unit K; see gated_forward.
template <typename K>
std::tuple<Tensor, Tensor, Tensor> unit_forward(const Tensor& proj, const Tensor& weight_t, const Tensor& bias,
                                                const Tensor& h0, const Tensor& mask, bool train) {
  const int64_t T = proj.size(0), B = proj.size(1), width = proj.size(2), H = weight_t.size(0);
  TORCH_CHECK(width == K::kGates * H && weight_t.size(1) == width, "gated_forward: expected ", text(K::kGates),
              " gates of ", text(H), " units, got proj of width ", text(width));
  TORCH_CHECK(bias.numel() == 0 || bias.numel() == width, "gated_forward: bias must be empty or of width ", text(width));
  check_mask<K>(mask, B, H, "gated_forward");
  const auto options = proj.options();
  const int64_t kw = K::kKept * H;
  Tensor out = at::empty({T, B, H}, options), kept = at::empty({train && kw ? T : 0, B, kw}, options);
  Tensor cell = at::empty({K::kCell ? (train ? T : 1) : 0, B, H}, options);  // LSTM's c: all of it, or the last
  Tensor mid = at::empty({K::kInner ? B : 0, H}, options);
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "gated_forward", [&] {
    const scalar_t *pp = proj.data_ptr<scalar_t>(), *h0p = h0.data_ptr<scalar_t>();
    const scalar_t* bp = bias.numel() ? bias.data_ptr<scalar_t>() : nullptr;
    const scalar_t* maskp = mask.numel() ? mask.data_ptr<scalar_t>() : nullptr;
    scalar_t *outp = out.data_ptr<scalar_t>(), *kp = kept.data_ptr<scalar_t>(), *cp = cell.data_ptr<scalar_t>(),
             *mp = mid.data_ptr<scalar_t>();
    auto step = [&](int64_t t, int64_t u0, int64_t u1, const scalar_t* U, int64_t ldu, int phase) {
      const int64_t n = u1 - u0;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t row = t * B + b;
        const scalar_t* hb = t ? outp + (row - B) * H : h0p + b * H;
        scalar_t* c_next = K::kCell ? cp + (train ? row : b) * H : nullptr;  // without train c_t overwrites c_{t-1}
        const scalar_t* c = K::kCell && t ? (train ? c_next - B * H : c_next) : nullptr;
        vec_for<scalar_t>(n, [&](int64_t i, int64_t m) {
          const int64_t j = u0 + i;
          const ForwardLane<scalar_t> x{pp + row * width + j, U + b * ldu + i, bp ? bp + j : nullptr, hb + j,
                                        c ? c + j : nullptr, c_next ? c_next + j : nullptr,
                                        kept.size(0) ? kp + row * kw + j : nullptr, K::kInner ? mp + b * H + j : nullptr,
                                        maskp ? maskp + b * H + j : nullptr, H, n, m};
          if constexpr (K::kInner > 0) {
            if (phase == 0) return K::inner(x);
          }
          K::forward(x).store(outp + row * H + j, m);
        });
      }
    };
    forward_loop<scalar_t>(T, B, H, K::kGates, K::kInner, weight_t.data_ptr<scalar_t>(), h0p, outp, mp, step);
  });
  return {out, kept, cell};
}

// Forward pass of a unit of the gated family (fast.gated.GatedRecurrence; the TorchScript loops of
// fast.loops mirror it): h_t = step(proj_t + W h_{t-1} + b, h_{t-1}) for the named unit.
// proj (T, B, G*H), weight_t (H, G*H), bias (G*H) or empty, h0 (B, H), mask (B, H) the candidate mask
// of the kMasked units or empty -> out (T, B, H), kept (T, B, kKept*H), what backward needs besides out
// (empty without train), and LSTM's c (T, B, H), (1, B, H) without train, else empty.
std::tuple<Tensor, Tensor, Tensor> gated_forward(c10::string_view unit, const Tensor& proj, const Tensor& weight_t,
                                                 const Tensor& bias, const Tensor& h0, const Tensor& mask, bool train) {
  check_cpu_contiguous(proj, "proj"), check_cpu_contiguous(weight_t, "weight_t"), check_cpu_contiguous(h0, "h0");
  check_cpu_contiguous(bias, "bias"), check_cpu_contiguous(mask, "mask");
  return with_unit(unit, [&](auto kind) { return unit_forward<decltype(kind)>(proj, weight_t, bias, h0, mask, train); });
}

// The backward pass of unit K; see gated_backward.
template <typename K>
std::tuple<Tensor, Tensor, Tensor, Tensor> unit_backward(const Tensor& kept, const Tensor& cell, const Tensor& out,
                                                         const Tensor& h0, const Tensor& mask, const Tensor& grad_out,
                                                         const Tensor& weight, bool bias_grad) {
  const int64_t T = out.size(0), B = out.size(1), H = out.size(2), width = weight.size(0);
  TORCH_CHECK(width == K::kGates * H, "gated_backward: expected ", text(K::kGates), " gates of ", text(H), " units");
  check_mask<K>(mask, B, H, "gated_backward");
  TORCH_CHECK(kept.numel() == T * B * K::kKept * H, "gated_backward: kept must be (T, B, ", text(K::kKept), " H)");
  TORCH_CHECK(!K::kCell || cell.numel() == T * B * H, "gated_backward: the cell state must be (T, B, H)");
  const auto options = out.options();
  const int64_t kw = K::kKept * H;
  Tensor du = at::empty({T, B, width}, options), dq = at::empty({K::kScaled ? T : 0, B, H}, options);
  Tensor grad_h0 = at::empty({B, H}, options), dc = at::zeros({K::kCell ? B : 0, H}, options);
  Tensor mid = at::empty({K::kInner ? B : 0, H}, options);
  Tensor grad_bias = at::zeros({bias_grad ? width : 0}, options);  // each thread sums its own units
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "gated_backward", [&] {
    const scalar_t *kp = kept.data_ptr<scalar_t>(), *cp = cell.data_ptr<scalar_t>(), *outp = out.data_ptr<scalar_t>(),
                   *h0p = h0.data_ptr<scalar_t>(), *gop = grad_out.data_ptr<scalar_t>();
    scalar_t *dup = du.data_ptr<scalar_t>(), *dqp = dq.data_ptr<scalar_t>(), *dcp = dc.data_ptr<scalar_t>(),
             *mp = mid.data_ptr<scalar_t>(), *dbp = bias_grad ? grad_bias.data_ptr<scalar_t>() : nullptr;
    const scalar_t* maskp = mask.numel() ? mask.data_ptr<scalar_t>() : nullptr;
    auto step = [&](int64_t t, int64_t u0, int64_t u1, const scalar_t* g, scalar_t* previous, int phase) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t row = t * B + b;
        const scalar_t* hb = t ? outp + (row - B) * H : h0p + b * H;
        const scalar_t* following = t ? gop + (row - B) * H : nullptr;  // dL/dh_{t-1} from above
        vec_for<scalar_t>(u1 - u0, [&](int64_t i, int64_t m) {
          const int64_t j = u0 + i;
          const BackwardLane<scalar_t> x{load(g + b * H + j, m), kp + row * kw + j, outp + row * H + j, hb + j,
                                         K::kCell ? cp + row * H + j : nullptr,
                                         K::kCell && t ? cp + (row - B) * H + j : nullptr,
                                         K::kCell ? dcp + b * H + j : nullptr, dup + row * width + j,
                                         K::kScaled ? dqp + row * H + j : nullptr,
                                         K::kInner ? mp + b * H + j : nullptr, dbp ? dbp + j : nullptr,
                                         maskp ? maskp + b * H + j : nullptr, H, m};
          if constexpr (K::kInner > 0) {
            if (phase == 0) return K::backward_inner(x);
          }
          auto carried = K::backward(x);
          if (following) carried = carried + load(following + j, m);
          carried.store(previous + b * H + j, m);
        });
      }
    };
    backward_loop<scalar_t>(T, B, H, width, K::kInner, weight.data_ptr<scalar_t>(), dup, gop + (T - 1) * B * H,
                            grad_h0.data_ptr<scalar_t>(), mp, step);
  });
  return {du, dq, grad_h0, grad_bias};
}

// Backward pass of gated_forward, the gate derivatives formed in the loop from what it kept:
// du_t = dL/d(W h_{t-1} + b) per gate (from dL/dh_t), g_{t-1} = grad_out_{t-1} + (the unit's direct
// path) + du_t @ weight (MGU: its candidate's rows give dL/ds first).
// kept (T, B, kKept*H), cell (T, B, H) or empty, out (T, B, H), h0 (B, H), mask (B, H) (the forward
// pass's candidate mask) or empty, grad_out (T, B, H), weight (G*H, H) -> du (T, B, G*H), dq (T, B, H) (GRU: the gradient of the projection of n, which
// du's n slot is not; else empty), dL/dh_0 (B, H), and with bias_grad the sum of du over frames and
// sequences (G*H), the gradient of b_hh, else empty.
std::tuple<Tensor, Tensor, Tensor, Tensor> gated_backward(c10::string_view unit, const Tensor& kept, const Tensor& cell,
                                                          const Tensor& out, const Tensor& h0, const Tensor& mask,
                                                          const Tensor& grad_out, const Tensor& weight, bool bias_grad) {
  check_cpu_contiguous(kept, "kept"), check_cpu_contiguous(cell, "cell"), check_cpu_contiguous(out, "out");
  check_cpu_contiguous(h0, "h0"), check_cpu_contiguous(grad_out, "grad_out"), check_cpu_contiguous(weight, "weight");
  check_cpu_contiguous(mask, "mask");
  return with_unit(unit, [&](auto kind) {
    return unit_backward<decltype(kind)>(kept, cell, out, h0, mask, grad_out, weight, bias_grad);
  });
}

// TPAMI layer-wise BRU forward, eq. 72-75 and 77 (fast.loops._lbru_loop): gates [z, r, n(, s)],
// q_t = p_n + z_{t-1} (U_n h_{t-1} + b_hh), h_t = n + r (h_{t-1} - n) (input gate) or n_t.
// proj (T, B, G*H), weight_t (H, G*H), bias (H), h0 (B, H) -> h (T, B, H), s (T, B, H) or empty,
// and with train the gate values [z, r, n(, s)] (without the input gate [z, n(, s)]) and
// U_n h_{t-1} + b_hh (T, B, H); else both empty.
std::tuple<Tensor, Tensor, Tensor, Tensor> lbru_forward(const Tensor& proj, const Tensor& weight_t, const Tensor& bias,
                                                        const Tensor& h0, bool train, bool input_gate) {
  check_cpu_contiguous(proj, "proj"), check_cpu_contiguous(weight_t, "weight_t");
  check_cpu_contiguous(bias, "bias"), check_cpu_contiguous(h0, "h0");
  const int64_t T = proj.size(0), B = proj.size(1), width = proj.size(2), H = weight_t.size(0), gates = width / H;
  const bool has_s = gates == 4;
  const auto options = proj.options();
  Tensor out = at::empty({T, B, H}, options), s = at::empty({has_s ? T : 0, B, H}, options);
  const int64_t kept_width = input_gate ? width : width - H;
  Tensor pre = at::empty({train ? T : 0, B, kept_width}, options), hidden = at::empty({train ? T : 0, B, H}, options);
  Tensor z_previous = at::zeros({B, H}, options);
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "lbru_forward", [&] {
    const scalar_t *pp = proj.data_ptr<scalar_t>(), *bp = bias.data_ptr<scalar_t>(), *h0p = h0.data_ptr<scalar_t>();
    scalar_t *outp = out.data_ptr<scalar_t>(), *sp = s.data_ptr<scalar_t>(), *zp = z_previous.data_ptr<scalar_t>();
    scalar_t *prep = pre.data_ptr<scalar_t>(), *hidp = hidden.data_ptr<scalar_t>();
    auto step = [&](int64_t t, int64_t u0, int64_t u1, const scalar_t* U, int64_t ldu, int /*phase*/) {
      const int64_t n = u1 - u0;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t row = t * B + b;
        const scalar_t *pb = pp + row * width, *Ub = U + b * ldu - u0;  // gate g of unit j: Ub[g * n + j]
        const scalar_t* hb = t ? outp + (row - B) * H : h0p + b * H;
        scalar_t *zb = zp + b * H, *hn = outp + row * H;
        scalar_t* kept = train ? prep + row * kept_width : nullptr;
        vec_for<scalar_t>(n, [&](int64_t i, int64_t m) {
          const int64_t j = u0 + i;
          const auto a_z = load(pb + j, m) + load(Ub + j, m);                       // (72)
          const auto e = load(Ub + 2 * n + j, m) + load(bp + j, m);                  // U_n h_{t-1} + b_hh
          const auto q = at::vec::fmadd(load(zb + j, m), e, load(pb + 2 * H + j, m));  // (74)
          const auto z = sigmoid(a_z), nv = sigmoid(q);
          Vec<scalar_t> r(scalar_t(0)), sv(scalar_t(0));
          if (input_gate) r = sigmoid(load(pb + H + j, m) + load(Ub + n + j, m));       // (73)
          if (has_s) sv = sigmoid(load(pb + 3 * H + j, m) + load(Ub + 3 * n + j, m));  // (77)
          if (kept) {  // the gate values: backward needs them, not the pre-activations
            z.store(kept + j, m);
            if (input_gate) {
              r.store(kept + H + j, m), nv.store(kept + 2 * H + j, m);
              if (has_s) sv.store(kept + 3 * H + j, m);
            } else {
              nv.store(kept + H + j, m);
              if (has_s) sv.store(kept + 2 * H + j, m);
            }
            e.store(hidp + row * H + j, m);
          }
          if (input_gate)
            at::vec::fmadd(r, load(hb + j, m) - nv, nv).store(hn + j, m);  // (75)
          else
            nv.store(hn + j, m);  // (36)
          if (has_s) sv.store(sp + row * H + j, m);
          z.store(zb + j, m);  // z_{t-1} of the next step: read above before this write
        });
      }
    };
    forward_loop<scalar_t>(T, B, H, gates, 0, weight_t.data_ptr<scalar_t>(), h0p, outp, nullptr, step);
  });
  return {out, s, pre, hidden};
}

// LBRURecurrence.backward, everything per frame computed in the loop's one pass per step. With z, r,
// n, s the saved gate values (r = 0 without the input gate, where h_t = n_t),
// K1 = (1 - r) n (1 - n) = dh_t / dq_t, G_t = dL/dh_t (all included) and E_t = U_n h_{t-1} + b_hh:
//   dq_t  = G_t K1_t                         the gradient of q_t, the pre-activation of n (74)
//   du_r  = G_t (h_{t-1} - n_t) r (1 - r)    (75)
//   du_n  = dq_t z_{t-1}                     of U_n h_{t-1} + b_hh
//   du_z  = dq_{t+1} E_{t+1} z_t (1 - z_t)   z_t enters q_{t+1}
//   ds    = dL/ds_t s (1 - s)                (77)
//   G_{t-1} = dL/dh_{t-1} (from above) + r_t G_t + du_t @ weight.
// gates (T, B, G*H) [z, r, n(, s)], or without the input gate (T, B, (G-1)*H) [z, n(, s)];
// E, h (T, B, H) (h: with the input gate only, else empty), h0 (B, H), grad_h (T, B, H), grad_s
// (T, B, H) or empty, weight (G*H, H) -> du (T, B, G*H) [du_z, du_r, du_n(, ds)], dq (T, B, H),
// dL/dh_0 (B, H).
std::tuple<Tensor, Tensor, Tensor> lbru_backward(const Tensor& gates, const Tensor& E, const Tensor& h, const Tensor& h0,
                                                 const Tensor& grad_h, const Tensor& grad_s, const Tensor& weight,
                                                 bool input_gate) {
  check_cpu_contiguous(gates, "gates"), check_cpu_contiguous(E, "E"), check_cpu_contiguous(h, "h");
  check_cpu_contiguous(h0, "h0"), check_cpu_contiguous(grad_h, "grad_h"), check_cpu_contiguous(grad_s, "grad_s");
  check_cpu_contiguous(weight, "weight");
  const int64_t T = grad_h.size(0), B = grad_h.size(1), H = grad_h.size(2), width = weight.size(0);
  const bool has_s = width == 4 * H;
  TORCH_CHECK(!has_s || grad_s.numel() == T * B * H, "lbru_backward: 4 gates need grad_s");
  TORCH_CHECK(!input_gate || h.numel() == T * B * H, "lbru_backward: the input gate needs h");
  const int64_t kw = gates.size(2), n_at = input_gate ? 2 * H : H, s_at = n_at + H;
  Tensor du = at::empty({T, B, width}, grad_h.options()), dq = at::empty_like(grad_h);
  Tensor grad_h0 = at::empty({B, H}, grad_h.options());
  AT_DISPATCH_FLOATING_TYPES(grad_h.scalar_type(), "lbru_backward", [&] {
    using V = Vec<scalar_t>;
    const scalar_t *gatep = gates.data_ptr<scalar_t>(), *Ep = E.data_ptr<scalar_t>(), *hp = h.data_ptr<scalar_t>(),
                   *h0p = h0.data_ptr<scalar_t>(), *ghp = grad_h.data_ptr<scalar_t>(), *gsp = grad_s.data_ptr<scalar_t>();
    scalar_t *dup = du.data_ptr<scalar_t>(), *dqp = dq.data_ptr<scalar_t>();
    const V zero(scalar_t(0)), one(scalar_t(1));
    auto step = [&](int64_t t, int64_t u0, int64_t u1, const scalar_t* g, scalar_t* previous, int /*phase*/) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t row = t * B + b;
        const scalar_t *pb = gatep + row * kw, *gb = g + b * H;
        const scalar_t* p_before = t ? pb - B * kw : nullptr;  // gates at t - 1
        const scalar_t* p_after = t < T - 1 ? pb + B * kw : nullptr;
        const scalar_t* h_before = input_gate ? (t ? hp + (row - B) * H : h0p + b * H) : nullptr;
        const scalar_t* following = t ? ghp + (row - B) * H : nullptr;
        scalar_t *dub = dup + row * width, *dqb = dqp + row * H, *pvb = previous + b * H;
        vec_for<scalar_t>(u1 - u0, [&](int64_t i, int64_t m) {
          const int64_t j = u0 + i;
          const auto gv = load(gb + j, m), z = load(pb + j, m), n = load(pb + n_at + j, m);
          auto K1 = n * (one - n);
          auto carried = following ? load(following + j, m) : zero;
          if (input_gate) {
            const auto r = load(pb + H + j, m);
            K1 = (one - r) * K1;
            (gv * (load(h_before + j, m) - n) * r * (one - r)).store(dub + H + j, m);
            carried = at::vec::fmadd(r, gv, carried);
          } else {
            zero.store(dub + H + j, m);
          }
          const auto dqv = gv * K1;
          dqv.store(dqb + j, m);
          (p_before ? dqv * load(p_before + j, m) : zero).store(dub + 2 * H + j, m);
          const auto dz = p_after ? load(dqb + B * H + j, m) * load(Ep + (row + B) * H + j, m) * z * (one - z) : zero;
          dz.store(dub + j, m);
          if (has_s) {
            const auto sv = load(pb + s_at + j, m);
            (load(gsp + row * H + j, m) * sv * (one - sv)).store(dub + 3 * H + j, m);
          }
          carried.store(pvb + j, m);
        });
      }
    };
    backward_loop<scalar_t>(T, B, H, width, 0, weight.data_ptr<scalar_t>(), dup, ghp + (T - 1) * B * H,
                            grad_h0.data_ptr<scalar_t>(), nullptr, step);
  });
  return {du, dq, grad_h0};
}


// ---------------------------------------------------------------------------------------------
// Batch norm of the projections (models/norm.py, whose torch version stays the fallback).
//
// Frames x (N, C), statistics over the rows where real (N) is 1 (real empty: every row), the real rows
// normalised with them and the others (padding) written as 0, so that the layer need not copy the
// result to zero its padding; padded rows pass no gradient back. Autograd's version makes about five
// passes over x forward and eight backward; here each direction is two: one reading (the column
// sums), one writing. Threads split the columns for the sums, the rows for the writing pass. Sums are
// kept per column in double (the statistics of 10^4-10^5 frames), about a shift (the first real row)
// so that the variance is a difference of two numbers of the size of the variance, not of the squared
// mean.

// Per column of x (N, C) over the rows where real is nonzero (every row for an empty real):
// s1 = sum (x - shift), s2 = sum (x - shift)^2 (with y given: sum y, sum y (x - shift)).
template <typename T>
void column_sums(const T* x, const T* y, const T* real, const T* shift, int64_t N, int64_t C, double* s1,
                 double* s2) {
  at::parallel_for(0, C, 64, [&](int64_t begin, int64_t end) {
    constexpr int64_t kBlock = 128;  // rows summed in T before they are added in double
    const int64_t len = end - begin;
    std::vector<T> p1(len), p2(len);
    for (int64_t first = 0; first < N; first += kBlock) {
      std::fill(p1.begin(), p1.end(), T(0)), std::fill(p2.begin(), p2.end(), T(0));
      for (int64_t i = first; i < std::min(N, first + kBlock); ++i) {
        if (real && real[i] == T(0)) continue;
        const T *xi = x + i * C + begin, *yi = y ? y + i * C + begin : nullptr;
        vec_for<T>(len, [&](int64_t j, int64_t n) {
          const auto d = load(xi + j, n) - load(shift + begin + j, n);
          const auto a = yi ? load(yi + j, n) : d;
          (load(p1.data() + j, n) + a).store(p1.data() + j, n);
          (load(p2.data() + j, n) + a * d).store(p2.data() + j, n);
        });
      }
      for (int64_t j = 0; j < len; ++j) s1[begin + j] += p1[j], s2[begin + j] += p2[j];
    }
  });
}

// out_i = a_i * scale + add_i (add: (C,), or add_i = -real_i (c0 + x_i c1) for the backward pass).
template <typename T, typename F>
void rows_apply(int64_t N, int64_t C, const F& row) {
  at::parallel_for(0, N, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) row(i);
  });
}

// Row i of (N, C) as zeros, where row i is padding (real given and 0): true if it was.
template <typename T>
bool zero_if_padding(const T* real, int64_t i, int64_t C, T* out) {
  if (!real || real[i] != T(0)) return false;
  std::fill(out + i * C, out + (i + 1) * C, T(0));
  return true;
}

// Returns (y (N, C), mean (C), biased variance (C)).
std::tuple<Tensor, Tensor, Tensor> batch_norm_forward(const Tensor& x, const Tensor& real, const Tensor& weight,
                                                      const Tensor& bias, double eps) {
  check_cpu_contiguous(x, "x"), check_cpu_contiguous(real, "real");
  check_cpu_contiguous(weight, "weight"), check_cpu_contiguous(bias, "bias");
  const int64_t N = x.size(0), C = x.size(1);
  Tensor y = at::empty_like(x), mean = at::empty({C}, x.options()), var = at::empty({C}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "batch_norm_forward", [&] {
    const scalar_t *xp = x.data_ptr<scalar_t>(), *rp = real.numel() ? real.data_ptr<scalar_t>() : nullptr;
    int64_t n = N, first = 0;
    if (rp) {
      n = 0;
      for (int64_t i = N - 1; i >= 0; --i)
        if (rp[i] != scalar_t(0)) ++n, first = i;
    }
    TORCH_CHECK(n > 0, "bru_kaldi batch norm: no real frame in the batch");
    const scalar_t* shift = xp + first * C;
    std::vector<double> s1(C, 0.0), s2(C, 0.0);
    column_sums<scalar_t>(xp, nullptr, rp, shift, N, C, s1.data(), s2.data());
    scalar_t *mp = mean.data_ptr<scalar_t>(), *vp = var.data_ptr<scalar_t>();
    const scalar_t *wp = weight.data_ptr<scalar_t>(), *bp = bias.data_ptr<scalar_t>();
    std::vector<scalar_t> scale(C), offset(C);
    for (int64_t c = 0; c < C; ++c) {
      const double m1 = s1[c] / n, v = std::max(0.0, s2[c] / n - m1 * m1);
      mp[c] = scalar_t(shift[c] + m1), vp[c] = scalar_t(v);
      scale[c] = scalar_t(wp[c] / std::sqrt(v + eps));
      offset[c] = bp[c] - mp[c] * scale[c];
    }
    scalar_t* yp = y.data_ptr<scalar_t>();
    rows_apply<scalar_t>(N, C, [&](int64_t i) {
      if (zero_if_padding(rp, i, C, yp)) return;
      vec_for<scalar_t>(C, [&](int64_t j, int64_t k) {
        (load(xp + i * C + j, k) * load(scale.data() + j, k) + load(offset.data() + j, k)).store(yp + i * C + j, k);
      });
    });
  });
  return {y, mean, var};
}

// Gradient of batch_norm_forward, with scale = w / sqrt(var + eps) and xhat = (x - mean) / sqrt(var + eps),
// sums over the real rows (the padded ones are constant 0): dL/db = sum_i g_i, dL/dw = sum_i g_i xhat_i,
// and for a real row dL/dx_i = scale g_i - (c0 + c1 x_i), c1 = scale dL/dw / (n sqrt(var + eps)),
// c0 = scale dL/db / n - mean c1; 0 for a padded row.
// Returns (dL/dx (N, C), dL/dw (C), dL/db (C)).
std::tuple<Tensor, Tensor, Tensor> batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& real,
                                                       const Tensor& mean, const Tensor& var, const Tensor& weight,
                                                       double eps) {
  check_cpu_contiguous(grad, "grad"), check_cpu_contiguous(x, "x"), check_cpu_contiguous(real, "real");
  const int64_t N = x.size(0), C = x.size(1);
  Tensor grad_x = at::empty_like(x), grad_w = at::empty({C}, x.options()), grad_b = at::empty({C}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "batch_norm_backward", [&] {
    const scalar_t *gp = grad.data_ptr<scalar_t>(), *xp = x.data_ptr<scalar_t>(), *mp = mean.data_ptr<scalar_t>();
    const scalar_t *rp = real.numel() ? real.data_ptr<scalar_t>() : nullptr, *wp = weight.data_ptr<scalar_t>();
    const scalar_t* vp = var.data_ptr<scalar_t>();
    double n = N;
    if (rp) {
      n = 0;
      for (int64_t i = 0; i < N; ++i) n += rp[i];
    }
    std::vector<double> s1(C, 0.0), s2(C, 0.0);
    column_sums<scalar_t>(xp, gp, rp, mp, N, C, s1.data(), s2.data());  // sum g, sum g (x - mean)
    std::vector<scalar_t> scale(C), c0(C), c1(C);
    scalar_t *gwp = grad_w.data_ptr<scalar_t>(), *gbp = grad_b.data_ptr<scalar_t>();
    for (int64_t c = 0; c < C; ++c) {
      const double inv = 1.0 / std::sqrt(double(vp[c]) + eps), sc = wp[c] * inv, gw = inv * s2[c];
      gwp[c] = scalar_t(gw), gbp[c] = scalar_t(s1[c]);
      const double k1 = sc * inv * gw / n;
      scale[c] = scalar_t(sc), c1[c] = scalar_t(k1), c0[c] = scalar_t(sc * s1[c] / n - mp[c] * k1);
    }
    scalar_t* gxp = grad_x.data_ptr<scalar_t>();
    rows_apply<scalar_t>(N, C, [&](int64_t i) {
      if (zero_if_padding(rp, i, C, gxp)) return;
      vec_for<scalar_t>(C, [&](int64_t j, int64_t k) {
        const auto correction = load(c0.data() + j, k) + load(xp + i * C + j, k) * load(c1.data() + j, k);
        (load(gp + i * C + j, k) * load(scale.data() + j, k) - correction).store(gxp + i * C + j, k);
      });
    });
  });
  return {grad_x, grad_w, grad_b};
}

}  // namespace

TORCH_LIBRARY(bru_kaldi, m) {
  m.def("softplus_scan(Tensor c, Tensor k, Tensor x0, bool reverse) -> Tensor");
  m.def("softplus_scan_backward(Tensor grad, Tensor k, Tensor x0, Tensor x, bool reverse) -> (Tensor, Tensor, Tensor)");
  m.def("kalman_smoother(Tensor x, Tensor k, Tensor last) -> Tensor");
  m.def("kalman_smoother_backward(Tensor grad, Tensor x, Tensor k, Tensor last, Tensor gamma) -> (Tensor, Tensor)");
  m.def("gated_forward(str unit, Tensor proj, Tensor weight_t, Tensor bias, Tensor h0, Tensor mask, bool train)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("gated_backward(str unit, Tensor kept, Tensor cell, Tensor out, Tensor h0, Tensor mask, Tensor grad_out,"
        " Tensor weight, bool bias_grad) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("lbru_forward(Tensor proj, Tensor weight_t, Tensor bias, Tensor h0, bool train, bool input_gate)"
        " -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("batch_norm_forward(Tensor x, Tensor real, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("batch_norm_backward(Tensor grad, Tensor x, Tensor real, Tensor mean, Tensor var, Tensor weight, float eps)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("lbru_backward(Tensor gates, Tensor E, Tensor h, Tensor h0, Tensor grad_h, Tensor grad_s, Tensor weight,"
        " bool input_gate) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(bru_kaldi, CPU, m) {
  m.impl("softplus_scan", &softplus_scan);
  m.impl("softplus_scan_backward", &softplus_scan_backward);
  m.impl("kalman_smoother", &kalman_smoother);
  m.impl("kalman_smoother_backward", &kalman_smoother_backward);
  m.impl("gated_forward", &gated_forward);
  m.impl("gated_backward", &gated_backward);
  m.impl("lbru_forward", &lbru_forward);
  m.impl("lbru_backward", &lbru_backward);
  m.impl("batch_norm_forward", &batch_norm_forward);
  m.impl("batch_norm_backward", &batch_norm_backward);
}
