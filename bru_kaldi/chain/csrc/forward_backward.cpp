// The LF-MMI forward-backward on the CPU, one sequence per thread; loaded by bru_kaldi/chain/native.py.
//
// It computes what the loop of torch ops in bru_kaldi/chain/objective.py computes (that file's
// docstring has the maths: probability domain, per-frame shift by the largest output, the leaky HMM
// after every boundary, normalisation by z_t after the leak, the backward scaled by the same z_t, time
// windows, padding frames that change nothing) and stays its reference and its fallback.
//
// Why by hand: the torch loop launches about 25 small ops per frame and direction for the whole batch
// (gathers and scatter_add_ over B x A arcs), and on a CPU a training step spends most of its objective
// time in their overhead, not in the few microseconds of arithmetic of a frame. Here each sequence is a
// plain loop over its own frames and arcs:
//   - threads take whole sequences (at::parallel_for with grain 1 over bins of sequences balanced by
//     length): a sequence's recursion is serial in time, and one thread per sequence needs no atomics;
//   - the P outputs of a frame are exponentiated once per pass (ATen's vectorised exp), not once per arc;
//   - the arcs are arranged once per graph (see Arcs): per (state, pdf) pair the product alpha * e is
//     formed once, not once per arc, and each pass walks the arcs in the order in which consecutive
//     arcs add into different entries, so that no addition waits on the one before; a graph shared by
//     the batch (the denominator, ChainGraph.expand's stride-0 views) is arranged once per call and
//     never copied B times;
//   - arcs of weight 0 (the padding of a batch of numerator graphs) are dropped: they carry nothing;
//   - frames at or past a sequence's length are never read (their posteriors are written as 0).
//
// Arithmetic is in double whatever the tensors' dtype (the torch loop works in the dtype itself): the
// passes are scalar gathers, which cost the same in double, and the vectors of a sequence (its T + 1
// alphas of S states) stay in a core's L2 either way. The per-frame exp is done in the outputs' dtype,
// as torch does it, then widened; the graph's weights are cast to the outputs' dtype first, as the
// torch loop casts them. Results are rounded to the outputs' dtype at the end: float64 agrees with the
// torch loop to rounding, float32 to float32's rounding of a longer sum (the C++ is the more accurate).
// The tests: tests/test_chain_native.py.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using at::Tensor;

// A (B, ...) tensor of the graph batch as contiguous rows, cast to `first` then to `type`, and the
// distance between rows: 0 where every sequence has the same row (an expanded view, stride 0), which is
// then cast and read once instead of being copied B times.
struct Rows {
  Tensor data;
  int64_t stride;
};

Rows rows(const Tensor& t, at::ScalarType first, at::ScalarType type) {
  if (t.size(0) > 1 && t.stride(0) == 0) {
    return {t.select(0, 0).to(first).to(type).contiguous(), 0};
  }
  Tensor all = t.to(first).to(type).contiguous();
  return {all, t.size(0) ? all.numel() / t.size(0) : 0};
}

// One graph's arcs, arranged for the two passes. An arc i -> j with pdf p and weight w contributes
// alpha[i] * e[p] * w to the next alpha[j], and the product alpha[i] * e[p] is the same for every arc of
// one (source, pdf) pair: a "source" here. In Kaldi's denominator every arc out of a state has that
// state's pdf, so there are S sources for A ~ 10 S arcs, and per arc the passes are left with one
// gather, one multiply and one add (a numerator's arcs are all sources of their own: no loss, no gain).
// Sources are numbered in order of (state, pdf). Arcs of weight 0 (the padding of a batch of numerator
// graphs) are left out: they carry nothing.
//
// The forward pass walks the arcs by source (then as given), adding into alpha[j]: consecutive arcs
// leave one source for different states, so the additions do not wait on each other. The backward pass
// walks them by destination (then by source), adding w * after[j] into its source's sum: consecutive
// arcs come from different sources, likewise. The sorts are stable: the sums are deterministic.
struct Arcs {
  std::vector<int32_t> source_state, source_pdf;    // (V): each source's state and pdf
  std::vector<int32_t> by_source, by_source_dst;    // (K): the forward order: the arc's source and dst
  std::vector<double> by_source_weight;             // (K)
  std::vector<int32_t> by_dst, by_dst_dst;          // (K): the backward order: source and dst
  std::vector<double> by_dst_weight;                // (K)

  int64_t num_sources() const { return int64_t(source_state.size()); }
  int64_t num_arcs() const { return int64_t(by_source.size()); }

  void build(const int64_t* src, const int64_t* dst, const int64_t* pdf, const double* weight, int64_t A,
             int64_t S, int64_t P) {
    std::vector<int64_t> kept;
    kept.reserve(A);
    for (int64_t a = 0; a < A; ++a) {
      TORCH_CHECK(src[a] >= 0 && src[a] < S && dst[a] >= 0 && dst[a] < S,
                  "bru_kaldi_chain: an arc's state is outside [0, ", S, ")");
      TORCH_CHECK(pdf[a] >= 0 && pdf[a] < P, "bru_kaldi_chain: an arc's pdf is outside [0, ", P, ")");
      if (weight[a] != 0.0) kept.push_back(a);
    }
    std::stable_sort(kept.begin(), kept.end(), [&](int64_t a, int64_t b) {
      return src[a] != src[b] ? src[a] < src[b] : pdf[a] < pdf[b];
    });
    const int64_t K = int64_t(kept.size());
    source_state.clear(), source_pdf.clear();
    by_source.resize(K), by_source_dst.resize(K), by_source_weight.resize(K);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t a = kept[k];
      if (k == 0 || src[a] != source_state.back() || pdf[a] != source_pdf.back()) {
        source_state.push_back(int32_t(src[a])), source_pdf.push_back(int32_t(pdf[a]));
      }
      by_source[k] = int32_t(source_state.size() - 1), by_source_dst[k] = int32_t(dst[a]);
      by_source_weight[k] = weight[a];
    }
    std::vector<int64_t> order(K);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return by_source_dst[a] < by_source_dst[b]; });
    by_dst.resize(K), by_dst_dst.resize(K), by_dst_weight.resize(K);
    for (int64_t k = 0; k < K; ++k) {
      by_dst[k] = by_source[order[k]], by_dst_dst[k] = by_source_dst[order[k]];
      by_dst_weight[k] = by_source_weight[order[k]];
    }
  }
};

// sum(v[0..n)) in four running sums: a single one is a chain of dependent additions, one per element.
inline double sum(const double* v, int64_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) s[0] += v[i], s[1] += v[i + 1], s[2] += v[i + 2], s[3] += v[i + 3];
  for (; i < n; ++i) s[0] += v[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

inline double dot(const double* u, const double* v, int64_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s[0] += u[i] * v[i], s[1] += u[i + 1] * v[i + 1], s[2] += u[i + 2] * v[i + 2], s[3] += u[i + 3] * v[i + 3];
  }
  for (; i < n; ++i) s[0] += u[i] * v[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// e[p] = exp(x[p] - max_p x) for one frame's P outputs (max and exp vectorised, the exp in the outputs'
// dtype, as torch computes it); returns the max (0 for P = 0, as the torch loop's shift).
template <typename scalar_t>
double shifted_exp(const scalar_t* x, int64_t P, scalar_t* scratch, double* e) {
  using Vec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t L = Vec::size();
  if (P == 0) return 0.0;
  scalar_t m = x[0];
  int64_t p = 0;
  if (P >= L) {
    Vec largest = Vec::loadu(x);
    for (p = L; p + L <= P; p += L) largest = at::vec::maximum(largest, Vec::loadu(x + p));
    scalar_t lanes[L];
    largest.store(lanes);
    m = *std::max_element(lanes, lanes + L);
  }
  for (; p < P; ++p) m = std::max(m, x[p]);
  const Vec shift(m);
  for (p = 0; p + L <= P; p += L) (Vec::loadu(x + p) - shift).exp().store(scratch + p);
  if (p < P) (Vec::loadu(x + p, P - p) - shift).exp().store(scratch + p, P - p);
  for (int64_t q = 0; q < P; ++q) e[q] = double(scratch[q]);
  return double(m);
}

inline double safe(double z) { return z > 0.0 ? z : 1.0; }  // a dead sequence: zeros, not NaN

// The buffers of one thread, reused from sequence to sequence.
template <typename scalar_t>
struct Workspace {
  Arcs arcs;                        // this sequence's graph, when graphs are not shared
  std::vector<double> alphas;       // (n + 1, S): alpha after each boundary, normalised
  std::vector<double> norms;        // (n + 1): z_t
  std::vector<double> e, post;      // (P): one frame's exp(x - max), its posteriors
  std::vector<scalar_t> scratch;    // (P)
  std::vector<double> beta, after;  // (S)
  std::vector<double> source;       // (V): a product (forward) or a sum (backward) per source
};

struct Graph {  // the pointers of one sequence's graph
  const Arcs* arcs;
  const double *initial, *final, *windows;  // windows: (T', S) or null
  int64_t window_frames;
};

// One sequence: writes its log-probability and posteriors (T, P) (rows at or past n as 0).
template <typename scalar_t>
void sequence(const scalar_t* x, int64_t n, int64_t T, int64_t P, int64_t S, const Graph& g, double leaky,
              Workspace<scalar_t>& w, scalar_t* logprob, scalar_t* posteriors) {
  const Arcs& arcs = *g.arcs;
  const int64_t V = arcs.num_sources(), K = arcs.num_arcs();
  w.alphas.resize((n + 1) * S), w.norms.resize(n + 1);
  w.e.resize(P), w.post.resize(P), w.scratch.resize(P), w.beta.resize(S), w.after.resize(S), w.source.resize(V);
  double *alphas = w.alphas.data(), *e = w.e.data(), *source = w.source.data();
  const double* pi = g.initial;
  const int32_t *source_state = arcs.source_state.data(), *source_pdf = arcs.source_pdf.data();

  // alpha L: alpha + c * sum(alpha) * pi, then divided by its sum z; returns z.
  auto leak_and_normalise = [&](double* alpha) {
    double z = sum(alpha, S);
    if (leaky != 0.0) {
      const double leak = leaky * z;
      for (int64_t s = 0; s < S; ++s) alpha[s] += leak * pi[s];
      z = sum(alpha, S);
    }
    const double divisor = safe(z);
    for (int64_t s = 0; s < S; ++s) alpha[s] /= divisor;
    return z;
  };

  // forward: boundary 0 is pi itself, leaked; boundary t follows frame t - 1
  std::copy(pi, pi + S, alphas);
  w.norms[0] = leak_and_normalise(alphas);
  double total = std::log(w.norms[0]);
  for (int64_t t = 1; t <= n; ++t) {
    total += shifted_exp(x + (t - 1) * P, P, w.scratch.data(), e);
    const double* previous = alphas + (t - 1) * S;
    double* alpha = alphas + t * S;
    std::fill(alpha, alpha + S, 0.0);
    const bool closed = g.windows && t - 1 >= g.window_frames;  // past a numerator's frames: no state open
    if (!closed) {
      for (int64_t v = 0; v < V; ++v) source[v] = previous[source_state[v]] * e[source_pdf[v]];
      const int32_t *from = arcs.by_source.data(), *to = arcs.by_source_dst.data();
      const double* weight = arcs.by_source_weight.data();
      for (int64_t a = 0; a < K; ++a) alpha[to[a]] += source[from[a]] * weight[a];
      if (g.windows) {
        const double* open = g.windows + (t - 1) * S;
        for (int64_t j = 0; j < S; ++j) alpha[j] *= open[j];
      }
    }
    w.norms[t] = leak_and_normalise(alpha);
    total += std::log(w.norms[t]);
  }
  const double last = dot(alphas + n * S, g.final, S);
  *logprob = scalar_t(total + std::log(last));

  // backward: beta_t scaled so that alphas[t] . beta_t = 1; frame t - 1's posteriors come from beta_t
  double *beta = w.beta.data(), *after = w.after.data(), *post = w.post.data();
  for (int64_t s = 0; s < S; ++s) beta[s] = g.final[s] / safe(last);
  for (int64_t t = n; t >= 1; --t) {
    shifted_exp(x + (t - 1) * P, P, w.scratch.data(), e);
    // after = (L beta) * window: the backward leak beta + c * (pi . beta) and the frame's window. The
    // frame's normaliser z_t divides the sums (beta_{t-1} and the posteriors) instead of every arc: fewer
    // divisions, and a graph of one path gets posteriors of exactly 1, as the torch loop does
    const double leak = leaky != 0.0 ? leaky * dot(pi, beta, S) : 0.0;
    const bool closed = g.windows && t - 1 >= g.window_frames;
    const double* open = g.windows && !closed ? g.windows + (t - 1) * S : nullptr;
    for (int64_t s = 0; s < S; ++s) {
      const double value = beta[s] + leak;
      after[s] = closed ? 0.0 : open ? value * open[s] : value;
    }
    // per source: sum over its arcs of w * after[j]; then beta_{t-1}[i] = sum over i's sources of
    // e[p] * that, and the posterior of p adds alpha_{t-1}[i] * e[p] * that
    std::fill(source, source + V, 0.0);
    const int32_t *from = arcs.by_dst.data(), *to = arcs.by_dst_dst.data();
    const double* weight = arcs.by_dst_weight.data();
    for (int64_t a = 0; a < K; ++a) source[from[a]] += weight[a] * after[to[a]];
    const double* previous = alphas + (t - 1) * S;
    std::fill(post, post + P, 0.0);
    std::fill(beta, beta + S, 0.0);
    for (int64_t v = 0; v < V; ++v) {
      const int32_t i = source_state[v], p = source_pdf[v];
      const double q = e[p] * source[v];
      beta[i] += q;
      if (previous[i] > 0.0) post[p] += previous[i] * q;  // where alpha = 0, 0 * inf could make NaN
    }
    const double z = safe(w.norms[t]);
    for (int64_t s = 0; s < S; ++s) beta[s] /= z;
    scalar_t* row = posteriors + (t - 1) * P;
    for (int64_t p = 0; p < P; ++p) row[p] = scalar_t(post[p] / z);
  }
  std::fill(posteriors + n * P, posteriors + T * P, scalar_t(0));
}

// Sequences grouped into `bins` bins of about equal work (frames; longest first into the least loaded
// bin): at::parallel_for splits its range into equal contiguous blocks, one per thread, which for a
// batch sorted by length would leave one thread with all the long sequences.
std::vector<std::vector<int64_t>> balanced(const int64_t* lengths, int64_t B, int64_t bins) {
  std::vector<int64_t> order(B);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int64_t>> out(bins);
  std::vector<int64_t> load(bins, 0);
  for (int64_t b : order) {
    const int64_t k = std::min_element(load.begin(), load.end()) - load.begin();
    out[k].push_back(b), load[k] += lengths[b] + 1;
  }
  return out;
}

// Returns (logprob (B,), posteriors (B, T, P)) in x's dtype. x: (B, T, P) float32/float64; lengths: (B,)
// int64; src, dst, pdf: (B, A) int64; weight: (B, A); initial, final: (B, S); windows: (B, T', S) or
// undefined; every graph tensor may be a stride-0 expansion of one graph.
std::tuple<Tensor, Tensor> forward_backward(const Tensor& x_in, const Tensor& lengths_in, const Tensor& src_in,
                                            const Tensor& dst_in, const Tensor& pdf_in, const Tensor& weight_in,
                                            const Tensor& initial_in, const Tensor& final_in,
                                            const std::optional<Tensor>& windows_in, double leaky) {
  TORCH_CHECK(x_in.device().is_cpu() && x_in.dim() == 3, "bru_kaldi_chain: x must be a (B, T, P) CPU tensor");
  const int64_t B = x_in.size(0), T = x_in.size(1), P = x_in.size(2);
  const int64_t S = initial_in.size(1), A = src_in.size(1);
  TORCH_CHECK(lengths_in.dim() == 1 && lengths_in.size(0) == B, "bru_kaldi_chain: lengths must be (B,)");
  for (const Tensor* t : {&src_in, &dst_in, &pdf_in, &weight_in}) {
    TORCH_CHECK(t->dim() == 2 && t->size(0) == B && t->size(1) == A, "bru_kaldi_chain: arcs must be (B, A)");
  }
  for (const Tensor* t : {&src_in, &dst_in, &pdf_in}) {
    TORCH_CHECK(t->scalar_type() == at::kLong, "bru_kaldi_chain: arc ids must be int64");
  }
  TORCH_CHECK(initial_in.dim() == 2 && initial_in.size(0) == B && final_in.sizes() == initial_in.sizes(),
              "bru_kaldi_chain: initial and final must be (B, S)");
  TORCH_CHECK(S < std::numeric_limits<int32_t>::max() && P < std::numeric_limits<int32_t>::max(),
              "bru_kaldi_chain: too many states or pdfs");
  const bool has_windows = windows_in.has_value() && windows_in->defined();
  if (has_windows) {
    TORCH_CHECK(windows_in->dim() == 3 && windows_in->size(0) == B && windows_in->size(2) == S,
                "bru_kaldi_chain: windows must be (B, T', S)");
  }
  const Tensor x = x_in.contiguous();
  const Tensor lengths = lengths_in.to(at::kLong).contiguous();
  const int64_t* length = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(length[b] >= 0 && length[b] <= T, "bru_kaldi_chain: a length is outside [0, ", T, "]");
  }
  const auto id = at::kLong, dtype = x.scalar_type(), wide = at::kDouble;
  const Rows src = rows(src_in, id, id), dst = rows(dst_in, id, id), pdf = rows(pdf_in, id, id);
  // the graph's numbers in the outputs' dtype (as the torch loop casts them), then in double
  const Rows weight = rows(weight_in, dtype, wide), initial = rows(initial_in, dtype, wide);
  const Rows final = rows(final_in, dtype, wide);
  Rows windows{Tensor(), 0};
  if (has_windows) windows = rows(*windows_in, dtype, wide);
  const int64_t window_frames = has_windows ? windows_in->size(1) : 0;
  const bool shared = src.stride == 0 && dst.stride == 0 && pdf.stride == 0 && weight.stride == 0;

  Tensor logprob = at::empty({B}, x.options()), posteriors = at::empty({B, T, P}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "bru_kaldi_chain_forward_backward", [&] {
    const int64_t *src_p = src.data.data_ptr<int64_t>(), *dst_p = dst.data.data_ptr<int64_t>();
    const int64_t* pdf_p = pdf.data.data_ptr<int64_t>();
    const double* weight_p = weight.data.data_ptr<double>();
    Arcs common;
    if (shared && B > 0) common.build(src_p, dst_p, pdf_p, weight_p, A, S, P);
    const auto bins = balanced(length, B, std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), B)));
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t *lp = logprob.data_ptr<scalar_t>(), *pp = posteriors.data_ptr<scalar_t>();
    at::parallel_for(0, int64_t(bins.size()), 1, [&](int64_t begin, int64_t end) {
      Workspace<scalar_t> w;
      for (int64_t k = begin; k < end; ++k) {
        for (int64_t b : bins[k]) {
          Graph g;
          if (shared) {
            g.arcs = &common;
          } else {
            w.arcs.build(src_p + b * src.stride, dst_p + b * dst.stride, pdf_p + b * pdf.stride,
                         weight_p + b * weight.stride, A, S, P);
            g.arcs = &w.arcs;
          }
          g.initial = initial.data.data_ptr<double>() + b * initial.stride;
          g.final = final.data.data_ptr<double>() + b * final.stride;
          g.windows = has_windows ? windows.data.data_ptr<double>() + b * windows.stride : nullptr;
          g.window_frames = window_frames;
          sequence<scalar_t>(xp + b * T * P, length[b], T, P, S, g, leaky, w, lp + b, pp + b * T * P);
        }
      }
    });
  });
  return {logprob, posteriors};
}

}  // namespace

TORCH_LIBRARY(bru_kaldi_chain, m) {
  m.def("forward_backward(Tensor x, Tensor lengths, Tensor src, Tensor dst, Tensor pdf, Tensor weight,"
        " Tensor initial, Tensor final, Tensor? windows, float leaky) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(bru_kaldi_chain, CPU, m) { m.impl("forward_backward", &forward_backward); }
