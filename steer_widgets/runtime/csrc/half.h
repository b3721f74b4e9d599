// IEEE half <-> float32: GGUF stores its block scales as halves, and products="int8" keeps
// its keys and values as halves.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace sw {

// f16 -> f32, exact (subnormal halves are normal floats; inf and NaN are refused at load)
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  const uint32_t bits = sign | ((exp == 31 ? 255u : exp + 112u) << 23) | (mant << 13);
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// f32 -> f16, rounded to nearest with ties to even: torch's conversion (and F16C's with
// _MM_FROUND_TO_NEAREST_INT) for every number; a NaN becomes the quiet NaN 0x7e00 (its
// sign kept), where F16C keeps some of its payload
inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and above round to inf
  if (x < 0x38800000u) {  // below 2^-14: a subnormal half, m * 2^-24 (m = 1024: 2^-14)
    float a;
    std::memcpy(&a, &x, sizeof a);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 0x1p24f));  // exact scaling
  }
  const uint32_t rest = x & 0x1fffu, h = ((x >> 13) - (112u << 10));  // rebias 127 -> 15
  return sign | static_cast<uint16_t>(h + (rest > 0x1000u || (rest == 0x1000u && (h & 1u))));
}

// the half at p (any alignment)
inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

}  // namespace sw
