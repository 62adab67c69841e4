"""The C++ every generated kernel file starts with: type conversions and the helpers whose semantics
C++ operators do not already have (NaN-propagating max, Python-style integer division, defined
shifts, reduction combines). It includes only standard headers, never torch's, so a file compiles in
well under a second."""

# reduction accumulators per row: four AVX-512 vectors of floats, so that four independent chains hide
# the latency of the vector add (one accumulator vector made a row sum latency-bound)
LANES = 64

PRELUDE = r"""
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <limits>
#include <type_traits>

// glibc's libmvec has SIMD versions of the libm functions; declaring them `simd` lets the vectorizer
// call them from `omp simd` loops (glibc only declares them so under -ffast-math, which ember avoids
// to keep IEEE NaN and rounding semantics). The build defines EMBER_LIBMVEC when -lmvec links.
#if defined(EMBER_LIBMVEC) && defined(__GLIBC__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EMBER_SIMD_FN(name) \
  extern "C" __attribute__((simd("notinbranch"))) float name##f(float) noexcept; \
  extern "C" __attribute__((simd("notinbranch"))) double name(double) noexcept;
#define EMBER_SIMD_FN2(name) \
  extern "C" __attribute__((simd("notinbranch"))) float name##f(float, float) noexcept; \
  extern "C" __attribute__((simd("notinbranch"))) double name(double, double) noexcept;
EMBER_SIMD_FN(exp) EMBER_SIMD_FN(log) EMBER_SIMD_FN(sin) EMBER_SIMD_FN(cos) EMBER_SIMD_FN2(pow)
#if __GLIBC_PREREQ(2, 35)
EMBER_SIMD_FN(exp2) EMBER_SIMD_FN(expm1) EMBER_SIMD_FN(log2) EMBER_SIMD_FN(log10) EMBER_SIMD_FN(log1p)
EMBER_SIMD_FN(tan) EMBER_SIMD_FN(asin) EMBER_SIMD_FN(acos) EMBER_SIMD_FN(atan) EMBER_SIMD_FN(sinh)
EMBER_SIMD_FN(cosh) EMBER_SIMD_FN(tanh) EMBER_SIMD_FN(asinh) EMBER_SIMD_FN(acosh) EMBER_SIMD_FN(atanh)
EMBER_SIMD_FN(erf) EMBER_SIMD_FN(erfc) EMBER_SIMD_FN2(atan2) EMBER_SIMD_FN2(hypot)
#endif
#endif

namespace ember {

static inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// bfloat16 is the top half of a float32; rounding to it is round-to-nearest-even on the low half.
static inline float bf16_to_float(uint16_t h) { return bits_to_float((uint32_t)h << 16); }
static inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return f != f ? (uint16_t)((u >> 16) | 0x40u) : (uint16_t)r;
}

// IEEE half <-> float with plain integer and float arithmetic (exact, branch-light, vectorizable):
// the exponent is rebiased by a multiply so float hardware does the rounding and subnormals.
static inline float half_to_float(uint16_t h) {
  const uint32_t w = (uint32_t)h << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = bits_to_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t r = sign | (two_w < (1u << 27) ? float_to_bits(denormalized) : float_to_bits(normalized));
  return bits_to_float(r);
}
static inline uint16_t float_to_half(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = float_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = bits_to_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_to_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
static inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }
static inline float round_half(float f) { return half_to_float(float_to_half(f)); }

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// torch.maximum / amax: a NaN operand wins
// (`|`, not `||`: no branch, so the vectorizer also takes the short lane-combining loops)
template <typename T> static inline T max_nan(T a, T b) { return ((a > b) | (a != a)) ? a : b; }
template <typename T> static inline T min_nan(T a, T b) { return ((a < b) | (a != a)) ? a : b; }

// log(exp(a) + exp(b)) without overflow: max + log1p(exp(min - max)). Equal values give max + log(2), so
// equal infinities give that infinity (min - max would be nan); a NaN operand propagates.
template <typename T> static inline T logaddexp(T a, T b) {
  const bool pick_a = (a > b) | (a != a);
  const T mx = pick_a ? a : b, mn = pick_a ? b : a;
  return mx + std::log1p(std::exp(mx == mn ? T(0) : mn - mx));
}

// Python semantics; division by zero gives 0 instead of a hardware trap
template <typename T> static inline T floordiv_int(T a, T b) {
  if (b == 0) return 0;
  if (std::is_signed<T>::value && b == (T)-1) return (T)(0 - (std::make_unsigned_t<T>)a);
  T q = a / b;
  return ((a % b) != 0 && ((a < 0) != (b < 0))) ? (T)(q - 1) : q;
}
template <typename T> static inline T remainder_int(T a, T b) {
  if (b == 0 || (std::is_signed<T>::value && b == (T)-1)) return 0;
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
}
template <typename T> static inline T fmod_int(T a, T b) {
  if (b == 0 || (std::is_signed<T>::value && b == (T)-1)) return 0;
  return a % b;
}
template <typename T> static inline T remainder_float(T a, T b) {
  T r = std::fmod(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// floor(a / b) as Python computes it: from fmod, so that a == b * q + r holds exactly
template <typename T> static inline T floordiv_float(T a, T b) {
  if (b == 0) return a / b;
  T mod = std::fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  if (div == 0) return std::copysign(T(0), a / b);
  T fl = std::floor(div);
  return (div - fl > T(0.5)) ? fl + 1 : fl;
}

// shifts past the width are defined in torch (0, or the sign for >>), undefined in C++
template <typename T> static inline T shl(T a, T b) {
  typedef std::make_unsigned_t<T> U;
  return (b < 0 || b >= (T)(sizeof(T) * 8)) ? (T)0 : (T)((U)a << b);
}
template <typename T> static inline T shr(T a, T b) {
  if (b < 0 || b >= (T)(sizeof(T) * 8)) return (std::is_signed<T>::value && a < 0) ? (T)-1 : (T)0;
  return (T)(a >> b);
}

template <typename T> static inline T erfinv(T y) {
  double x = (double)y;
  if (!(x > -1.0 && x < 1.0)) {
    if (x == 1.0) return std::numeric_limits<T>::infinity();
    if (x == -1.0) return -std::numeric_limits<T>::infinity();
    return std::numeric_limits<T>::quiet_NaN();
  }
  // Giles' single-precision polynomial as a first guess, then Newton steps on erf in double
  double w = -std::log((1.0 - x) * (1.0 + x)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08; p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w; p = 0.00021858087 + p * w; p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w; p = 0.246640727 + p * w; p = 1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257; p = 0.000100950558 + p * w; p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w; p = 0.00573950773 + p * w; p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w; p = 1.00167406 + p * w; p = 2.83297682 + p * w;
  }
  double r = p * x;
  for (int i = 0; i < 2; ++i) {
    double d = 1.1283791670955126 * std::exp(-r * r);
    if (d == 0.0) break;
    r -= (std::erf(r) - x) / d;
  }
  return (T)r;
}

// erf of a float, written so the vectorizer inlines it into SIMD loops: about 30 vector ops, cheaper
// than libmvec's erff call and within 2.5 ulp of the exact erf (eager's own vectorized erf is only
// within 1.5e-7 absolute). Below 0.921875, erf(x) = x * P(x^2); above, 1 - exp(Q(|x|)) with Q fitted
// to log(erfc), so nothing cancels in 1 - erfc; erfc(3.92) < 2^-25, so erf rounds to +-1 beyond (the
// clamp keeps NaN, which then propagates). exp(q), q in [-18, -1.6], rounds n = q/ln2 by adding
// 1.5 * 2^23, which leaves n in the low bits of the sum: 2^n is built from those bits, with no float
// to int conversion of a possibly NaN value.
static inline float erf_fast(float x) {
  const float a = std::fabs(x), t = x * x;
  float p = -5.98558050e-04f;
  p = std::fma(p, t, 4.99210926e-03f);
  p = std::fma(p, t, -2.67658588e-02f);
  p = std::fma(p, t, 1.12817943e-01f);
  p = std::fma(p, t, -3.76124918e-01f);
  p = std::fma(p, t, 1.12837911f);
  const float u = (a > 3.92f ? 3.92f : a) - 0.921875f;
  float q = 1.94862470e-04f;
  q = std::fma(q, u, -1.95510266e-03f);
  q = std::fma(q, u, 1.06911166e-02f);
  q = std::fma(q, u, -4.47586179e-02f);
  q = std::fma(q, u, -8.33000958e-01f);
  q = std::fma(q, u, -2.50801182f);
  q = std::fma(q, u, -1.64856195f);
  const float k = std::fma(q, 1.44269504f, 12582912.0f);
  const float n = k - 12582912.0f;
  const float r = std::fma(n, -0.693147182f, q);
  float e = 1.39419036e-03f;
  e = std::fma(e, r, 8.36338848e-03f);
  e = std::fma(e, r, 4.16663662e-02f);
  e = std::fma(e, r, 1.66665748e-01f);
  e = std::fma(e, r, 0.5f);
  e = std::fma(e, r * r, r) + 1.0f;
  e *= bits_to_float((float_to_bits(k) + (127u - 0x4B400000u)) << 23);
  return a < 0.921875f ? x * p : std::copysign(1.0f - e, x);
}
// exp of a float, inlined into SIMD loops (within 1 ulp; libmvec's expf is a call per vector that
// takes a scalar slow path for every vector holding a -inf, as masked softmax rows do). 2^n * exp(r):
// n = x / ln2 rounded by adding 1.5 * 2^23 (n lands in the low bits of the sum), r = x - n*ln2 with ln2
// in two pieces, exp(r) by a degree-7 polynomial; 2^n as two factors so that results down into the
// subnormals round once. Beyond [-104, 88.72] the result is 0 or inf; NaN propagates through the
// arithmetic.
static inline float exp_fast(float x) {
  const float k = std::fma(x, 1.44269504f, 12582912.0f);
  const float n = k - 12582912.0f;
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9908436e-4f;
  p = std::fma(p, r, 1.3933902e-3f);
  p = std::fma(p, r, 8.3332844e-3f);
  p = std::fma(p, r, 4.1666463e-2f);
  p = std::fma(p, r, 1.6666667e-1f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r * r, r) + 1.0f;
  const int32_t ni = (int32_t)(float_to_bits(k) - 0x4B400000u), n1 = ni >> 1, n2 = ni - n1;
  const float y = p * bits_to_float((uint32_t)(n1 + 127) << 23) * bits_to_float((uint32_t)(n2 + 127) << 23);
  return x < -104.0f ? 0.0f : (x > 88.7228394f ? std::numeric_limits<float>::infinity() : y);
}
template <typename T> static inline T exp_(T x) { return std::exp(x); }
static inline float exp_(float x) { return exp_fast(x); }
template <typename T> static inline T erf_(T x) { return std::erf(x); }
static inline float erf_(float x) { return erf_fast(x); }

// argmax/argmin: the better value, and on ties (NaN ties NaN) the lower index; NaN beats numbers
template <bool MAX, typename T> static inline bool arg_better(T v, int64_t i, T bv, int64_t bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  if (MAX ? v > bv : v < bv) return true;
  return v == bv && i < bi;
}

// A reduction's lanes combined into one value with `f`: whole vectors lane-wise, then halving inside
// one vector with shuffles (GCC vector extensions: log2(width) shuffle+op steps). Written as scalar
// code, the vectorizer leaves this horizontal step to scalar compares and branches, a cost that
// rows of a few hundred elements pay on every row.
template <int N, typename T, typename F> static inline T reduce_lanes(const T* acc, F f) {
#if defined(__GNUC__) && !defined(__clang__)
  if constexpr ((sizeof(T) == 4 || sizeof(T) == 8) && !std::is_same<T, bool>::value && N * sizeof(T) % 64 == 0) {
    constexpr int W = 64 / sizeof(T);
    typedef T V __attribute__((vector_size(64)));
    typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> I;
    typedef I M __attribute__((vector_size(64)));
    V v;
    std::memcpy(&v, acc, 64);
    for (int k = 1; k < N / W; ++k) {
      V u;
      std::memcpy(&u, acc + k * W, 64);
      v = f(v, u);
    }
    // butterflies (lane l with l ^ s) as literal masks: single in-register permutes, set up once
    if constexpr (W == 16) {
      v = f(v, __builtin_shuffle(v, M{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
      v = f(v, __builtin_shuffle(v, M{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
      v = f(v, __builtin_shuffle(v, M{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
      v = f(v, __builtin_shuffle(v, M{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}));
    } else {
      v = f(v, __builtin_shuffle(v, M{4, 5, 6, 7, 0, 1, 2, 3}));
      v = f(v, __builtin_shuffle(v, M{2, 3, 0, 1, 6, 7, 4, 5}));
      v = f(v, __builtin_shuffle(v, M{1, 0, 3, 2, 5, 4, 7, 6}));
    }
    return v[0];
  }
#endif
  T r = acc[0];
  for (int l = 1; l < N; ++l) r = f(r, acc[l]);
  return r;
}

// dst[j * ldd + i] = src[i * lds + j] for a square block of EMBER_TW floats: tiles of transposed
// inputs are staged through this, one vector load and store per row, shuffled in registers in log2
// rounds (32-bit, 64-bit interleaves, then 128-bit lane shuffles), instead of one scalar copy per element.
#if defined(__GNUC__) && !defined(__clang__) && (defined(__AVX512F__) || defined(__AVX__))
#if defined(__AVX512F__)
#define EMBER_TW 16
#else
#define EMBER_TW 8
#endif
typedef float tile_vf __attribute__((vector_size(EMBER_TW * 4)));
typedef int32_t tile_vi __attribute__((vector_size(EMBER_TW * 4)));
static inline void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
  constexpr int W = EMBER_TW;
  tile_vf r[W], t[W];
#pragma GCC unroll 16
  for (int i = 0; i < W; ++i) std::memcpy(&r[i], src + i * lds, sizeof(tile_vf));
#if EMBER_TW == 16
  const tile_vi lo32 = {0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29};
  const tile_vi hi32 = {2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31};
  const tile_vi lo64 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
  const tile_vi hi64 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
  const tile_vi ln0 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const tile_vi ln1 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
#else
  const tile_vi lo32 = {0, 8, 1, 9, 4, 12, 5, 13}, hi32 = {2, 10, 3, 11, 6, 14, 7, 15};
  const tile_vi lo64 = {0, 1, 8, 9, 4, 5, 12, 13}, hi64 = {2, 3, 10, 11, 6, 7, 14, 15};
  const tile_vi ln0 = {0, 1, 2, 3, 8, 9, 10, 11}, ln1 = {4, 5, 6, 7, 12, 13, 14, 15};
#endif
#pragma GCC unroll 16
  for (int i = 0; i < W; i += 2) {
    t[i] = __builtin_shuffle(r[i], r[i + 1], lo32);
    t[i + 1] = __builtin_shuffle(r[i], r[i + 1], hi32);
  }
#pragma GCC unroll 16
  for (int i = 0; i < W; i += 4) {
    r[i] = __builtin_shuffle(t[i], t[i + 2], lo64);
    r[i + 1] = __builtin_shuffle(t[i], t[i + 2], hi64);
    r[i + 2] = __builtin_shuffle(t[i + 1], t[i + 3], lo64);
    r[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], hi64);
  }
  // 128-bit lanes: pairs 4 apart (16 wide only), then W/2 apart; the rows come out in column order
#if EMBER_TW == 16
#pragma GCC unroll 16
  for (int i = 0; i < W; ++i)
    if ((i & 4) == 0) {
      t[i] = __builtin_shuffle(r[i], r[i + 4], ln0);
      t[i + 4] = __builtin_shuffle(r[i], r[i + 4], ln1);
    }
#else
#pragma GCC unroll 8
  for (int i = 0; i < W; ++i) t[i] = r[i];
#endif
#pragma GCC unroll 8
  for (int i = 0; i < W / 2; ++i) {
    r[i] = __builtin_shuffle(t[i], t[i + W / 2], ln0);
    r[i + W / 2] = __builtin_shuffle(t[i], t[i + W / 2], ln1);
  }
#pragma GCC unroll 16
  for (int j = 0; j < W; ++j) std::memcpy(dst + j * ldd, &r[j], sizeof(tile_vf));
}
#else
#define EMBER_TW 8
static inline void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
  for (int i = 0; i < EMBER_TW; ++i)
    for (int j = 0; j < EMBER_TW; ++j) dst[j * ldd + i] = src[i * lds + j];
}
#endif

// Chan et al.: merge (mean, m2, weight) of b into a
template <typename T> static inline void welford_merge(T& mean, T& m2, T& w, T mb, T m2b, T wb) {
  T n = w + wb;
  if (n == 0) return;
  T delta = mb - mean;
  T frac = wb / n;
  mean = mean + delta * frac;
  m2 = m2 + m2b + delta * delta * w * frac;
  w = n;
}

// A Welford reduction's lanes merged into one (mean, m2, weight), pairwise: whole vectors lane-wise,
// then butterflies inside one vector, as reduce_lanes does (merging lane by lane is a chain of a
// division per lane on every row).
template <int N, typename T> static inline void welford_lanes(const T* m, const T* m2, const T* w, T& rm, T& rm2, T& rw) {
#if defined(__GNUC__) && !defined(__clang__)
  if constexpr ((sizeof(T) == 4 || sizeof(T) == 8) && std::is_floating_point<T>::value && N * sizeof(T) % 64 == 0) {
    constexpr int W = 64 / sizeof(T);
    typedef T V __attribute__((vector_size(64)));
    typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> I;
    typedef I M __attribute__((vector_size(64)));
    V am, am2, aw;
    std::memcpy(&am, m, 64);
    std::memcpy(&am2, m2, 64);
    std::memcpy(&aw, w, 64);
    auto merge = [&](V bm, V bm2, V bw) {
      const V n = aw + bw, delta = bm - am, zero = {};
      const V frac = n == zero ? zero : bw / n;      // an empty pair stays empty (0/0 is selected away)
      am = am + delta * frac;
      am2 = am2 + bm2 + delta * delta * aw * frac;
      aw = n;
    };
    for (int k = 1; k < N / W; ++k) {
      V bm, bm2, bw;
      std::memcpy(&bm, m + k * W, 64);
      std::memcpy(&bm2, m2 + k * W, 64);
      std::memcpy(&bw, w + k * W, 64);
      merge(bm, bm2, bw);
    }
    auto butterfly = [&](M p) { merge(__builtin_shuffle(am, p), __builtin_shuffle(am2, p), __builtin_shuffle(aw, p)); };
    if constexpr (W == 16) {
      butterfly(M{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
      butterfly(M{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
      butterfly(M{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
      butterfly(M{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    } else {
      butterfly(M{4, 5, 6, 7, 0, 1, 2, 3});
      butterfly(M{2, 3, 0, 1, 6, 7, 4, 5});
      butterfly(M{1, 0, 3, 2, 5, 4, 7, 6});
    }
    rm = am[0];
    rm2 = am2[0];
    rw = aw[0];
    return;
  }
#endif
  rm = m[0];
  rm2 = m2[0];
  rw = w[0];
  for (int l = 1; l < N; ++l) welford_merge(rm, rm2, rw, m[l], m2[l], w[l]);
}

// softmax's row statistics: merge (max, sum of exp(v - max)) of b into a, each sum rescaled to the common
// max; an empty part (sum 0: no element, or only -inf ones) adds nothing, also where both maxima are -inf
template <typename T> static inline void softmax_stats_merge(T& m, T& s, T mb, T sb) {
  const T mx = max_nan(m, mb);
  const T ea = s == T(0) ? T(0) : s * std::exp(m - mx);
  const T eb = sb == T(0) ? T(0) : sb * std::exp(mb - mx);
  m = mx;
  s = ea + eb;
}

// the lanes of a softmax_stats reduction merged into the row's (max, sum); a row of only -inf gets a nan
// sum, as eager's exp(-inf - -inf) does
template <int N, typename T> static inline void softmax_stats_lanes(const T* m, const T* s, T& rm, T& rs) {
  rm = m[0];
  rs = s[0];
  for (int l = 1; l < N; ++l) softmax_stats_merge(rm, rs, m[l], s[l]);
  if (rm == -std::numeric_limits<T>::infinity()) rs = std::numeric_limits<T>::quiet_NaN();
}

// Philox4x32-10 (Salmon et al., SC'11) laid out as Triton's tl.randint4x: counter (offset low, offset
// high, 0, 0), key (seed low, seed high). Matching it bit for bit makes the C++ and Triton backends
// draw the same numbers for the same seed; an element's value depends only on (seed, offset), never on
// which thread or kernel computes it.
static inline void philox4(int64_t seed, int64_t offset, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  uint32_t c0 = (uint32_t)(uint64_t)offset, c1 = (uint32_t)((uint64_t)offset >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)(uint64_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
#pragma GCC unroll 10
  for (int i = 0; i < 10; ++i) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p2 = (uint64_t)0xCD9E8D57u * c2;
    c0 = (uint32_t)(p2 >> 32) ^ c1 ^ k0;
    c2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p2;
    c3 = (uint32_t)p0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  r0 = c0;
  r1 = c1;
  r2 = c2;
  r3 = c3;
}
static inline void philox(int64_t seed, int64_t offset, uint32_t& r0, uint32_t& r1) {
  uint32_t r2, r3;
  philox4(seed, offset, r0, r1, r2, r3);
}
// Triton's uint_to_uniform_float: fold the sign away, scale so that the largest int32 stays below 1
static inline float uniform_from_bits(uint32_t bits) {
  int32_t x = (int32_t)bits;
  x = x < 0 ? ~x : x;
  return (float)x * 0x1.fffffep-32f;
}
static inline float philox_rand(int64_t seed, int64_t offset) {
  uint32_t r0, r1;
  philox(seed, offset, r0, r1);
  return uniform_from_bits(r0);
}
// Box-Muller on the first two words, as tl.randn
static inline float philox_randn(int64_t seed, int64_t offset) {
  uint32_t r0, r1;
  philox(seed, offset, r0, r1);
  const float u = uniform_from_bits(r0), u1 = u < 0x1.ad7f2ap-24f ? 0x1.ad7f2ap-24f : u;   // 1e-7: log(0) is -inf
  const float th = 0x1.921fb6p+2f * uniform_from_bits(r1);               // 2*pi
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(th);
}
// two words as one uint64, reduced into [low, high) (the modulo bias is below 2^-32 for ranges < 2^32)
static inline int64_t philox_randint64(int64_t seed, int64_t offset, int64_t low, int64_t high) {
  uint32_t r0, r1;
  philox(seed, offset, r0, r1);
  const uint64_t r = (uint64_t)r0 | ((uint64_t)r1 << 32);
  return (int64_t)((uint64_t)low + r % (uint64_t)(high - low));
}

// eight dropout keep flags (uniform >= p) from the four words of the draws at 2 * offset and 2 * offset + 1
// (as helpers.keep_bits8 in Triton)
static inline uint8_t philox_keep_bits8(int64_t seed, int64_t offset, float p) {
  uint32_t w[8];
  philox4(seed, 2 * offset, w[0], w[1], w[2], w[3]);
  philox4(seed, 2 * offset + 1, w[4], w[5], w[6], w[7]);
  uint8_t bits = 0;
  for (int j = 0; j < 8; ++j) bits |= (uint8_t)((uniform_from_bits(w[j]) >= p) << j);
  return bits;
}

}  // namespace ember
"""
