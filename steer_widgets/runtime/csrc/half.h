// IEEE half -> float32, exact: GGUF stores its block scales as halves.
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

// the half at p (any alignment)
inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

}  // namespace sw
