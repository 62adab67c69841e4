"""The C++ every generated kernel file starts with: type conversions and the helpers whose semantics
C++ operators do not already have (NaN-propagating max, Python-style integer division, defined
shifts, reduction combines). It includes only standard headers, never torch's, so a file compiles in
well under a second."""

LANES = 16   # reduction accumulators per row: wide enough for one AVX-512 vector of floats

PRELUDE = r"""
#include <cstdint>
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
template <typename T> static inline T max_nan(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> static inline T min_nan(T a, T b) { return (a < b || a != a) ? a : b; }

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

// argmax/argmin: the better value, and on ties (NaN ties NaN) the lower index; NaN beats numbers
template <bool MAX, typename T> static inline bool arg_better(T v, int64_t i, T bv, int64_t bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  if (MAX ? v > bv : v < bv) return true;
  return v == bv && i < bi;
}

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

}  // namespace ember
"""
