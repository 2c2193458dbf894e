// Numerics shared by the quantization kernels: NaN-propagating max, power-of-two scales, scale addressing.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "common/types.cuh"

namespace deep_kernels {

constexpr float kE4M3Max = 448.0f;

// NOTE: fmaxf drops NaN; torch's amax keeps it, and so must we to match the reference bit for bit.
DK_DEVICE float max_nan(float a, float b) {
    float result;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(result) : "f"(a), "f"(b));
    return result;
}

// The smallest power of two >= s, for finite positive s; inf and NaN pass through.
DK_DEVICE float ceil_to_power_of_two(float s) {
    const uint32_t bits = __float_as_uint(s);
    if ((bits >> 23) >= 0xffu)
        return s;
    const uint32_t exponent = (bits >> 23) + ((bits & 0x7fffffu) != 0u);
    return __uint_as_float(exponent << 23);
}

// The UE8M0 byte of a power-of-two scale: its biased exponent.
DK_DEVICE uint8_t ue8m0_byte(float power_of_two) {
    return static_cast<uint8_t>(__float_as_uint(power_of_two) >> 23);
}

// A UE8M0 byte back to FP32: 2^(byte - 127); byte 0 is the subnormal 2^-127.
DK_DEVICE float ue8m0_to_float(uint8_t byte) {
    return byte == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(static_cast<uint32_t>(byte) << 23);
}

// Element offset of (row, group)'s scale: FP32 elements, or bytes for the packed layout.
template <ScaleLayout kLayout>
DK_DEVICE uint64_t scale_offset(uint32_t row, uint32_t group, uint32_t scale_stride) {
    if constexpr (kLayout == ScaleLayout::RowMajor)
        return static_cast<uint64_t>(row) * scale_stride + group;
    else if constexpr (kLayout == ScaleLayout::MNMajor)
        return static_cast<uint64_t>(group) * scale_stride + row;
    else
        return (static_cast<uint64_t>(group / 4) * scale_stride + row) * 4 + group % 4;
}

}  // namespace deep_kernels
