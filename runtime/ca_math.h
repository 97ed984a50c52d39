/* Plain-C math helpers: float exp, erf, GELU and its derivative, selects and
   extrema. Shared by the C backend's generated code (codegen/templates/c/
   prelude.c.j2 pastes this file in, through compiled_autograd.codegen.c_text's template loader,
   so the text is part of each library's hash) and by the forward's C kernels
   (runtime/kernels.c). Runtime owns it: runtime must not include from codegen. */
#ifndef CA_MATH_H
#define CA_MATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>
/* Always inlined: a helper left as a call inside a loop stops the loop's
   vectorisation, and GCC's inliner gives up on calls in a long enough function
   (a larger GELU derivative, tried once, was inlined in a small test but left a
   call per element in the transformer's backward). */
#if defined(__GNUC__) || defined(__clang__)
#define CA_INLINE static inline __attribute__((always_inline))
#else
#define CA_INLINE static inline
#endif
/* Each helper comes as _f (float), _d (double) and, where an integer type can reach
   it, _i; the code generator picks the suffix from the computation's type
   (compiled_autograd.codegen.c: sfx). No _Generic macro: a macro writes its argument out again to
   pick the type, so nested calls (a chain of fused relus) grew the source
   exponentially. A helper of floats only maps _i to its double version. */
#define CA_NAN_FIRST(a, b, pick) ((a) != (a) ? (a) : (b) != (b) ? (b) : (pick))
CA_INLINE float ca_maximum_f(float a, float b) { return CA_NAN_FIRST(a, b, a > b ? a : b); }
CA_INLINE double ca_maximum_d(double a, double b) { return CA_NAN_FIRST(a, b, a > b ? a : b); }
CA_INLINE int64_t ca_maximum_i(int64_t a, int64_t b) { return a > b ? a : b; }
CA_INLINE float ca_minimum_f(float a, float b) { return CA_NAN_FIRST(a, b, a < b ? a : b); }
CA_INLINE double ca_minimum_d(double a, double b) { return CA_NAN_FIRST(a, b, a < b ? a : b); }
CA_INLINE int64_t ca_minimum_i(int64_t a, int64_t b) { return a < b ? a : b; }
CA_INLINE float ca_sign_f(float x) { return (float)((x > 0) - (x < 0)); }   /* NaN: 0, as torch */
CA_INLINE double ca_sign_d(double x) { return (double)((x > 0) - (x < 0)); }
CA_INLINE int64_t ca_sign_i(int64_t x) { return (x > 0) - (x < 0); }
/* where(c, a, b) and masked_fill as a call: the arguments, and the loads in them,
   are evaluated whatever c is. Written as c ? a : b over expressions that load,
   GCC 12 (-O3, AVX2 or AVX-512) if-converts the loads into masked loads and then
   vectorises some loop nests wrongly (a sum over a middle dim of small extents
   gave wrong sums; tests/test_c_backend.py keeps one such nest). */
CA_INLINE float ca_select_f(_Bool c, float a, float b) { return c ? a : b; }
CA_INLINE double ca_select_d(_Bool c, double a, double b) { return c ? a : b; }
CA_INLINE int64_t ca_select_i(_Bool c, int64_t a, int64_t b) { return c ? a : b; }
CA_INLINE float ca_bits_f(int32_t i) { float f; memcpy(&f, &i, sizeof f); return f; }
/* exp and erf in float, branch-free so that GCC vectorises the loops that call
   them (libm's are scalar calls). exp: x = k ln2 + r with |r| <= ln2/2, exp(r) =
   1 + r + r^2 P(r), scaled by 2^k in two steps (subnormals and overflow come out
   right); within 1 ulp. erf: t = |x|; t < 1: x + x P(x^2); else 1 - erfc(t) with
   erfc(t) = exp(-t^2) R(t), t clamped at 4 (erf is 1 in float there); within 2 ulp
   (1.2e-7). The coefficients are least-squares fits (docs/examples/fit_c_math.py
   prints them), checked on a dense sweep of floats by tests/test_c_math.py. Their
   polynomials use fused multiply-adds where the CPU has them (FP_FAST_FMAF): these
   are our functions, so -ffp-contract=off (which keeps the generated arithmetic
   equal to numpy's) does not concern them. Doubles use libm. */
#ifdef FP_FAST_FMAF
#define CA_FMA(a, b, c) fmaf(a, b, c)
#else
#define CA_FMA(a, b, c) ((a) * (b) + (c))
#endif
/* exp(r) for |r| <= ln2/2: 1 + r + r^2 P(r). */
CA_INLINE float ca_exp_reduced_f(float r) {
  float p = 1.982649992e-04f;
  p = CA_FMA(p, r, 1.394602354e-03f);
  p = CA_FMA(p, r, 8.333429694e-03f);
  p = CA_FMA(p, r, 4.166626930e-02f);
  p = CA_FMA(p, r, 1.666666567e-01f);
  p = CA_FMA(p, r, 5.000000000e-01f);
  p = CA_FMA(p * r, r, r) + 1.0f;
  return p;
}
CA_INLINE float ca_expf(float x) {
  float c = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  float k = (c * 1.44269504f + 12582912.0f) - 12582912.0f;   /* round to nearest */
  float r = (c - k * 0.693145751953125f) - k * 1.42860677e-06f;
  float p = ca_exp_reduced_f(r);
  int32_t ki = (int32_t)k, k1 = ki / 2, k2 = ki - k1;
  float y = p * ca_bits_f((k1 + 127) << 23) * ca_bits_f((k2 + 127) << 23);
  return x != x ? x : y;
}
/* exp(x) for x <= 0, where softmax (x - max), erf and GELU's derivative need it:
   ca_expf's reduction and polynomial, but 2^k is added to the result's exponent
   bits straight from the rounding sum (whose low bits hold k): no clamp above, no
   split scaling, no NaN select. The sum is offset by 64 and the result scaled by
   2^-64, so that 2^(k+64) is a normal number down to the clamp at -104: bit for
   bit ca_expf's result for every x <= 0 (its subnormal results rounded once, by
   that last product, as ca_expf's second scaling does). A NaN whose low bits are
   zero (the default NaN of an invalid operation, numpy's nan) gives NaN; one with
   a payload may not: callers whose input may hold one test for it first.
   GELU's derivative loop: 301 -> 248 us for 262,144 floats against ca_expf
   (benchmarks/c_breakdown.py); with a causal row's masked tail skipped, the
   transformer's four scaled_softmax kernels 0.58 -> 0.37 ms and its log_softmax
   0.32 -> 0.22 ms (benchmarks/forward_kernels.py, docs/performance.md). */
CA_INLINE float ca_exp_neg_f(float x) {
  float c = x < -104.0f ? -104.0f : x;
  float s = c * 1.44269504f + 12582912.0f;          /* 1.5 * 2^23 + k */
  float k = s - 12582912.0f;
  float r = (c - k * 0.693145751953125f) - k * 1.42860677e-06f;
  float p = ca_exp_reduced_f(r);
  float s64 = s + 64.0f;                            /* 1.5 * 2^23 + k + 64, exact */
  uint32_t sb, pb;
  memcpy(&sb, &s64, sizeof sb);
  memcpy(&pb, &p, sizeof pb);
  pb += sb << 23;      /* (k + 64) << 23: the sum's high bits shift out */
  memcpy(&p, &pb, sizeof p);
  return p * 5.42101086242752217e-20f;              /* 2^-64 */
}
/* erf(x) / x - 1 as a polynomial in s = x^2, for |x| < 1. */
CA_INLINE float ca_erf_small_f(float s) {
  float p = -5.696617882e-04f;
  p = CA_FMA(p, s, 4.934495315e-03f);
  p = CA_FMA(p, s, -2.672696859e-02f);
  p = CA_FMA(p, s, 1.128078848e-01f);
  p = CA_FMA(p, s, -3.761241436e-01f);
  return CA_FMA(p, s, 1.283791512e-01f);
}
/* R(t) = erfc(t) exp(t^2), a polynomial in (t - 2.5) / 1.5 fitted on 1 <= t <= 4;
   t is clamped to that range (callers use it where t >= 1, and past 4 the tail
   is below float's resolution next to 1). */
CA_INLINE float ca_erfc_scaled_f(float t) {
  float v = ((t < 1.0f ? 1.0f : (t > 4.0f ? 4.0f : t)) - 2.5f) * 0.6666666667f;
  float r = 8.639101725e-05f;
  r = CA_FMA(r, v, -2.435104398e-04f);
  r = CA_FMA(r, v, 3.925605561e-04f);
  r = CA_FMA(r, v, -9.199933847e-04f);
  r = CA_FMA(r, v, 2.404656727e-03f);
  r = CA_FMA(r, v, -5.608492531e-03f);
  r = CA_FMA(r, v, 1.249144226e-02f);
  r = CA_FMA(r, v, -2.699868008e-02f);
  r = CA_FMA(r, v, 5.611006171e-02f);
  r = CA_FMA(r, v, -1.115213335e-01f);
  r = CA_FMA(r, v, 2.108063698e-01f);
  return r;
}
/* R(t) = erfc(t) exp(t^2) again, one polynomial in (t - 2) / 2 fitted on
   0 <= t <= 4 (t clamped at 4; GELU's accuracy: tests/test_c_math.py): GELU's cdf from
   one exp and one polynomial, where erf needs two branches. */
CA_INLINE float ca_erfc_scaled0_f(float t) {
  float v = ((t > 4.0f ? 4.0f : t) - 2.0f) * 0.5f;
  float r = 8.422805113e-04f;
  r = CA_FMA(r, v, -1.995213330e-03f);
  r = CA_FMA(r, v, 8.896669606e-04f);
  r = CA_FMA(r, v, -5.055908114e-04f);
  r = CA_FMA(r, v, 4.874097649e-03f);
  r = CA_FMA(r, v, -1.000127383e-02f);
  r = CA_FMA(r, v, 1.438387297e-02f);
  r = CA_FMA(r, v, -2.298449539e-02f);
  r = CA_FMA(r, v, 3.783442453e-02f);
  r = CA_FMA(r, v, -5.874677375e-02f);
  r = CA_FMA(r, v, 8.706989884e-02f);
  r = CA_FMA(r, v, -1.236736625e-01f);
  r = CA_FMA(r, v, 1.672097445e-01f);
  r = CA_FMA(r, v, -2.135931998e-01f);
  r = CA_FMA(r, v, 2.553956807e-01f);
  return r;
}
CA_INLINE float ca_erff(float x) {
  float t = x < 0 ? -x : x, tc = t > 4.0f ? 4.0f : t;   /* (NaN: stays NaN) */
  float small = CA_FMA(x, ca_erf_small_f(x * x), x);
  float large = 1.0f - ca_exp_neg_f(-(tc * tc)) * ca_erfc_scaled_f(t);
  large = x < 0 ? -large : large;
  return t < 1.0f ? small : large;
}
CA_INLINE float ca_exp_f(float x) { return ca_expf(x); }
CA_INLINE double ca_exp_d(double x) { return exp(x); }
CA_INLINE float ca_erf_f(float x) { return ca_erff(x); }
CA_INLINE double ca_erf_d(double x) { return erf(x); }
CA_INLINE float ca_sigmoid_f(float x) {
  float e = ca_expf(-fabsf(x));
  return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
CA_INLINE double ca_sigmoid_d(double x) {
  double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}
/* exp(-x^2 / 2), the normal density's, for GELU and its derivative: x^2 = x2 +
   x2_lo exactly (with a fused multiply-add; else x2_lo is 0): the rounding of x^2
   alone costs exp a relative x^2/2 ulp (6.7e-7 at x = -5). Past x^2 = 172 it is
   below float's normal range: 0 (x2_lo may be infinite there, x^2 overflowing). */
CA_INLINE float ca_gauss_f(float x) {
  float x2 = x * x, x2_lo = CA_FMA(x, x, -x2);
  return ca_exp_neg_f(x2 * -0.5f) * (x2 < 172.0f ? CA_FMA(x2_lo, -0.5f, 1.0f) : 0.0f);
}
/* GELU: x cdf(x), the cdf erfc(-u) / 2 with u = x / sqrt(2): h = exp(-u^2) R(|u|) / 2
   is the cdf below 0 and 1 - h above: one exp and one polynomial where erf
   needs two branches (the transformer's four GELU kernels 0.94 -> 0.80 ms,
   benchmarks/forward_kernels.py), and no cancellation in the tail
   (float32's 1 + erf(u) is 0 once erf(u) rounds to -1, past x = -5.4). Within
   4e-7 relative of float64's GELU down to x = -5.6 (1.2e-6 without fused
   multiply-add); past it R's argument is clamped
   and the value, below 1e-8 |x|, is off by up to a factor of 2
   (tests/test_c_math.py). */
CA_INLINE float ca_gelu_f(float x) {
  float u = x * 0.70710678118654752f, t = u < 0 ? -u : u;
  float h = 0.5f * ca_gauss_f(x) * ca_erfc_scaled0_f(t);
  return x * (x < 0 ? h : 1.0f - h);
}
CA_INLINE double ca_gelu_d(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752)); }
CA_INLINE float ca_gelu_tanh_f(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
CA_INLINE double ca_gelu_tanh_d(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
/* GELU's derivative (the gelu_backward prim): cdf(x) + x pdf(x), with u = x/sqrt(2).
   In float, one exp serves both: e = exp(-x^2/2) = exp(-u^2) is the density's, and
   for |u| >= 1 the tail of the cdf is erfc(|u|)/2 = e R(|u|)/2, which for x < 0 is
   the cdf itself, without the cancellation of 1 + erf(u). */
CA_INLINE float ca_gelu_grad_f(float x) {
  float e = ca_gauss_f(x);
  float u = x * 0.70710678118654752f, t = u < 0 ? -u : u;
  float small = 0.5f + 0.5f * CA_FMA(u, ca_erf_small_f(u * u), u);
  float tail = 0.5f * e * ca_erfc_scaled_f(t);
  float cdf = t < 1.0f ? small : (x < 0 ? tail : 1.0f - tail);
  return cdf + x * (e * 0.3989422804014327f);
}
CA_INLINE double ca_gelu_grad_d(double x) {
  return 0.5 * (1.0 + erf(x * 0.70710678118654752)) + x * (exp(x * x * -0.5) * 0.3989422804014327);
}
CA_INLINE float ca_gelu_grad_tanh_f(float x) {
  float x2 = x * x, t = tanhf(0.7978845608028654f * (x + 0.044715f * x2 * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * (0.7978845608028654f * (1.0f + 0.134145f * x2));
}
CA_INLINE double ca_gelu_grad_tanh_d(double x) {
  double x2 = x * x, t = tanh(0.7978845608028654 * (x + 0.044715 * x2 * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (0.7978845608028654 * (1.0 + 0.134145 * x2));
}
/* Block-triangular products (matmul's `tri`: runtime/prims_reduce.py, whose
   tri_blocks is this rule in Python): block `i` of an M x N product over K, as
   rows [b[0], b[1]), columns [b[2], b[3]) and the range of k [b[4], b[5]); 0 past
   the last block. Blocks of CA_TRI_BLOCK rows, or columns for b_*. The out_*
   variants' rows are 0 outside their block's columns; an empty range of k is a
   block of zeros. kernels.c's matmul_tri and the C backend's loop over this. */
#define CA_TRI_BLOCK 16
enum { CA_TRI_A_LOWER = 1, CA_TRI_A_UPPER, CA_TRI_B_LOWER, CA_TRI_B_UPPER,
       CA_TRI_OUT_LOWER, CA_TRI_OUT_UPPER };
CA_INLINE int ca_tri_block(int tri, int64_t i, int64_t M, int64_t N, int64_t K, int64_t *b) {
  int by_cols = tri == CA_TRI_B_LOWER || tri == CA_TRI_B_UPPER;
  int64_t n = by_cols ? N : M, lo = i * CA_TRI_BLOCK;
  if (lo >= n) return 0;
  int64_t end = lo + CA_TRI_BLOCK;      /* the block's end in the triangle (not cut at n) */
  int64_t hi = end < n ? end : n;
  b[0] = by_cols ? 0 : lo; b[1] = by_cols ? M : hi;
  b[2] = by_cols ? lo : 0; b[3] = by_cols ? hi : N;
  b[4] = 0; b[5] = K;
  if (tri == CA_TRI_A_LOWER || tri == CA_TRI_B_UPPER) b[5] = end < K ? end : K;
  else if (tri == CA_TRI_A_UPPER || tri == CA_TRI_B_LOWER) b[4] = lo < K ? lo : K;
  else if (tri == CA_TRI_OUT_LOWER) b[3] = end < N ? end : N;
  else if (tri == CA_TRI_OUT_UPPER) b[2] = lo < N ? lo : N;
  return 1;
}
#define ca_exp_i ca_exp_d
#define ca_erf_i ca_erf_d
#define ca_sigmoid_i ca_sigmoid_d
#define ca_gelu_i ca_gelu_d
#define ca_gelu_tanh_i ca_gelu_tanh_d
#define ca_gelu_grad_i ca_gelu_grad_d
#define ca_gelu_grad_tanh_i ca_gelu_grad_tanh_d
#endif /* CA_MATH_H */
