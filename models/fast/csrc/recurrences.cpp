// Fused CPU kernels for the time loops of the fast paths; loaded by models/fast/native.py.
//
// Why by hand: on a CPU the TorchScript loops of models/fast/gated.py and models/fast/scans.py spend
// most of their time launching 4-9 small kernels per time step (about 9 us each), not computing, and
// a multi-threaded BLAS call on a product of B = 8-32 rows barely uses the second core. Here each
// time step is one fused pass over its values: for the cells with a recurrent matrix the threads
// split the hidden units for the whole loop (see forward_loop), and the purely elementwise
// recursions (UBRU alpha, its backward passes, their gradients) run their whole time loop in one
// call, split across threads by unit. Products go to the BLAS that libtorch calls (MKL on x86-64),
// the arithmetic to ATen's own vectorised math (at::vec::Vectorized, SLEEF exp / log1p), so no
// numerical code of our own beyond the equations.
//
// One translation unit (it runs past 450 lines for that reason): the build compiles one file, and the
// kernels share their vector helpers and the thread split.
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
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

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
// Cells with a recurrent matrix (models/fast/gated.py).
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

constexpr int64_t kMinUnitsPerThread = 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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
// the calling thread's units, then step(t, u0, u1, U, ldu) writes h_t (out[t]) for units [u0, u1),
// reading gate g of unit j at U[b * ldu + g * (u1 - u0) + j - u0]. weight_t (H, G*H), h0 (B, H),
// out (T, B, H).
template <typename T, typename Step>
void forward_loop(int64_t steps, int64_t B, int64_t H, int64_t gates, const T* weight_t, const T* h0, const T* out,
                  const Step& step) {
  std::vector<T> packed(H * gates * H), scratch(B * gates * H);
#pragma omp parallel num_threads(planned_threads(H))
  {
    const int threads = omp_get_num_threads(), tid = omp_get_thread_num();
    const auto [u0, u1] = own_units<T>(H, tid, threads);
    const int64_t n = u1 - u0, ld = gates * n;
    T* block = packed.data() + H * gates * u0;  // (H, G*n): this thread's columns of every gate
    T* U = scratch.data() + B * gates * u0;     // (B, G*n)
    for (int64_t i = 0; i < H; ++i)
      for (int64_t g = 0; g < gates; ++g)
        std::copy(weight_t + i * gates * H + g * H + u0, weight_t + i * gates * H + g * H + u1, block + i * ld + g * n);
    for (int64_t t = 0; t < steps; ++t) {
      if (n > 0) {
        // row-major U = h_{t-1} @ block is column-major U^T = block^T h_{t-1}^T
        gemm<T>(ld, B, H, block, ld, t ? out + (t - 1) * B * H : h0, H, T(0), U, ld);
        step(t, u0, u1, U, ld);
      }
#pragma omp barrier
    }
  }
}

// Backward time loop: for t = T-1..0, step(t, u0, u1, g_t, g_previous) fills the rows du[t] of the
// calling thread's units (every gate) and sets g_previous[:, u0:u1] to what reaches h_{t-1} other
// than through W; then g_{t-1} = g_previous + du[t] @ weight. weight (width, H), du (T, B, width),
// g_last = dL/dh_{T-1} (B, H). Writes dL/dh_{-1} (B, H) to grad_h0.
template <typename T, typename Step>
void backward_loop(int64_t steps, int64_t B, int64_t H, int64_t width, const T* weight, T* du, const T* g_last,
                   T* grad_h0, const Step& step) {
  std::vector<T> turns(2 * B * H);
  auto slot = [&](int64_t t) -> T* {  // where g_t lives, t = -1 .. T-1: two buffers in turn
    return t < 0 ? grad_h0 : turns.data() + (t % 2) * B * H;
  };
  std::copy(g_last, g_last + B * H, slot(steps - 1));
#pragma omp parallel num_threads(planned_threads(H))
  {
    const int threads = omp_get_num_threads(), tid = omp_get_thread_num();
    const auto [u0, u1] = own_units<T>(H, tid, threads);
    for (int64_t t = steps - 1; t >= 0; --t) {
      T* previous = slot(t - 1);
      if (u1 > u0) step(t, u0, u1, slot(t), previous);
#pragma omp barrier
      if (u1 > u0)  // previous[:, u0:u1] += du[t] @ weight[:, u0:u1] (column-major: W_block^T du^T)
        gemm<T>(u1 - u0, B, width, weight + u0, H, du + t * B * width, width, T(1), previous + u0, H);
      // No second barrier: the next step reads only this thread's units of g, and writes rows du[t-1].
    }
  }
}

enum GatedKind { kBRU, kLiBRU, kLiGRU };

// The one table that ties a unit's name (models.UNITS, as the Python fast paths pass it) to its
// fused kernel: callers pass the name, never a number that depends on the order of a list.
GatedKind gated_kind(c10::string_view unit) {
  if (unit == "bru") return kBRU;
  if (unit == "libru") return kLiBRU;
  if (unit == "ligru") return kLiGRU;
  TORCH_CHECK(false, "gated_forward: no fused kernel for unit '", std::string(unit), "' (bru, libru, ligru)");
}

// BRU (eq. 6, log h), Li-BRU (eq. 7c, log h) and Li-GRU (eq. 8) forward; see fast.gated._*_loop.
// proj (T, B, G*H), weight_t (H, G*H), h0 (B, H) -> out (T, B, H) and what backward needs besides
// out: the pre-activations a (Li-GRU; BRU needs none) or [log z, log h~] (Li-BRU), and for Li-BRU
// log h_{t-1} - a_z. Without train those keep one slot, overwritten every step.
std::tuple<Tensor, Tensor, Tensor> gated_forward(c10::string_view unit, const Tensor& proj, const Tensor& weight_t,
                                                 const Tensor& h0, bool train) {
  check_cpu_contiguous(proj, "proj"), check_cpu_contiguous(weight_t, "weight_t"), check_cpu_contiguous(h0, "h0");
  const GatedKind kind = gated_kind(unit);
  const int64_t T = proj.size(0), B = proj.size(1), width = proj.size(2), H = weight_t.size(0), gates = width / H;
  const int64_t slots = train ? T : 1;
  Tensor out = at::empty({T, B, H}, proj.options());
  Tensor saved = at::empty({kind == kBRU ? 0 : slots, B, width}, proj.options());
  Tensor diff = at::empty({kind == kLiBRU ? slots : 0, B, H}, proj.options());
  AT_DISPATCH_FLOATING_TYPES(proj.scalar_type(), "gated_forward", [&] {
    const scalar_t* pp = proj.data_ptr<scalar_t>();
    scalar_t *outp = out.data_ptr<scalar_t>(), *sp = saved.data_ptr<scalar_t>(), *dp = diff.data_ptr<scalar_t>();
    auto step = [&](int64_t t, int64_t u0, int64_t u1, const scalar_t* U, int64_t ldu) {
      const int64_t n = u1 - u0, slot = train ? t : 0;
      for (int64_t b = 0; b < B; ++b) {
        const scalar_t *pb = pp + (t * B + b) * width, *Ub = U + b * ldu - u0;
        const scalar_t* h_previous = (t ? outp + ((t - 1) * B + b) * H : h0.data_ptr<scalar_t>() + b * H);
        scalar_t *hn = outp + (t * B + b) * H, *kept = sp + (slot * B + b) * width;
        vec_for<scalar_t>(n, [&](int64_t i, int64_t m) {
          const int64_t j = u0 + i;
          const auto a_z = load(pb + j, m) + load(Ub + j, m);
          if (kind == kBRU) {  // backward needs only log h: 1 - sigma(a) = -expm1(log h)
            log_sigmoid(a_z).store(hn + j, m);
            return;
          }
          const auto a_h = load(pb + H + j, m) + load(Ub + n + j, m), h = load(h_previous + j, m);
          if (kind == kLiGRU) {  // h + z (relu(a_h) - h)
            a_z.store(kept + j, m), a_h.store(kept + H + j, m);
            at::vec::fmadd(sigmoid(a_z), at::vec::maximum(a_h, Vec<scalar_t>(scalar_t(0))) - h, h).store(hn + j, m);
            return;
          }
          // log h_t = log z + logaddexp(log h~, log h_{t-1} - a_z), as log(1 - z) = log z - a_z
          const auto log_z = log_sigmoid(a_z), log_c = log_sigmoid(a_h), d = h - a_z;
          log_z.store(kept + j, m), log_c.store(kept + H + j, m);
          d.store(dp + (slot * B + b) * H + j, m);
          (log_z + logaddexp(log_c, d)).store(hn + j, m);
        });
      }
    };
    forward_loop<scalar_t>(T, B, H, gates, weight_t.data_ptr<scalar_t>(), h0.data_ptr<scalar_t>(), outp, step);
  });
  return {out, saved, diff};
}

// The sequential part of the backward pass of gated_forward (fast.gated._gated_backward):
// da_t = K_t * g_t (g_t repeated per gate), g_{t-1} = grad_out_{t-1} + C_t * g_t + da_t @ weight.
// K (T, B, G*H), C (T, B, H), grad_out (T, B, H), weight (G*H, H) -> da (T, B, G*H), dL/dh_0 (B, H).
std::tuple<Tensor, Tensor> gated_backward(const Tensor& K, const Tensor& C, const Tensor& grad_out,
                                          const Tensor& weight) {
  check_cpu_contiguous(K, "K"), check_cpu_contiguous(C, "C"), check_cpu_contiguous(grad_out, "grad_out");
  check_cpu_contiguous(weight, "weight");
  const int64_t T = K.size(0), B = K.size(1), width = K.size(2), H = grad_out.size(2), gates = width / H;
  Tensor da = at::empty_like(K), grad_h0 = at::empty({B, H}, grad_out.options());
  AT_DISPATCH_FLOATING_TYPES(K.scalar_type(), "gated_backward", [&] {
    const scalar_t *Kp = K.data_ptr<scalar_t>(), *Cp = C.data_ptr<scalar_t>(), *gop = grad_out.data_ptr<scalar_t>();
    scalar_t* dap = da.data_ptr<scalar_t>();
    auto step = [&](int64_t t, int64_t u0, int64_t u1, const scalar_t* g, scalar_t* previous) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t row = t * B + b;
        const scalar_t *gb = g + b * H, *Cb = Cp + row * H, *Kb = Kp + row * width;
        const scalar_t* following = t ? gop + (row - B) * H : nullptr;
        scalar_t *dab = dap + row * width, *pb = previous + b * H;
        vec_for<scalar_t>(u1 - u0, [&](int64_t i, int64_t m) {
          const int64_t j = u0 + i;
          const auto gv = load(gb + j, m);
          for (int64_t q = 0; q < gates; ++q) (load(Kb + q * H + j, m) * gv).store(dab + q * H + j, m);
          auto c = load(Cb + j, m) * gv;
          if (following) c = c + load(following + j, m);
          c.store(pb + j, m);
        });
      }
    };
    backward_loop<scalar_t>(T, B, H, width, weight.data_ptr<scalar_t>(), dap, gop + (T - 1) * B * H,
                            grad_h0.data_ptr<scalar_t>(), step);
  });
  return {da, grad_h0};
}

// TPAMI layer-wise BRU forward, eq. 72-75 and 77 (fast.gated._lbru_loop): gates [z, r, n(, s)],
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
    auto step = [&](int64_t t, int64_t u0, int64_t u1, const scalar_t* U, int64_t ldu) {
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
    forward_loop<scalar_t>(T, B, H, gates, weight_t.data_ptr<scalar_t>(), h0p, outp, step);
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
    auto step = [&](int64_t t, int64_t u0, int64_t u1, const scalar_t* g, scalar_t* previous) {
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
    backward_loop<scalar_t>(T, B, H, width, weight.data_ptr<scalar_t>(), dup, ghp + (T - 1) * B * H,
                            grad_h0.data_ptr<scalar_t>(), step);
  });
  return {du, dq, grad_h0};
}

}  // namespace

TORCH_LIBRARY(bru_kaldi, m) {
  m.def("softplus_scan(Tensor c, Tensor k, Tensor x0, bool reverse) -> Tensor");
  m.def("softplus_scan_backward(Tensor grad, Tensor k, Tensor x0, Tensor x, bool reverse) -> (Tensor, Tensor, Tensor)");
  m.def("kalman_smoother(Tensor x, Tensor k, Tensor last) -> Tensor");
  m.def("kalman_smoother_backward(Tensor grad, Tensor x, Tensor k, Tensor last, Tensor gamma) -> (Tensor, Tensor)");
  m.def("gated_forward(str unit, Tensor proj, Tensor weight_t, Tensor h0, bool train) -> (Tensor, Tensor, Tensor)");
  m.def("gated_backward(Tensor K, Tensor C, Tensor grad_out, Tensor weight) -> (Tensor, Tensor)");
  m.def("lbru_forward(Tensor proj, Tensor weight_t, Tensor bias, Tensor h0, bool train, bool input_gate)"
        " -> (Tensor, Tensor, Tensor, Tensor)");
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
}
