// Brute force behind csrc/common/quant.cuh's divide_by_scale: for every FP32 divisor significand (divisor in
// [1, 2)), every 5-bit boundary b = k / 16 in [1, 2) (the e4m3 rounding midpoints of every binade, and 2^-10
// where 0 and 2^-9 meet, once quotient and divisor are scaled to [1, 2)) and every x within 4 ulps of b * divisor,
// the steps q0 = RN(x r), e = RN(q0 d - x), q = RN(q0 - e r), r = RN(1 / d), against IEEE x / d; then the same
// steps with d = 6 (csrc/common/fp4.cuh's amax / 6) for every FP32 x from 2^-125 to FLT_MAX. Exits 1 on any FP32
// difference (none: ~1.2e9 and ~2e9 cases, seconds).
// Usage: gcc -O2 -mfma -ffp-contract=off scripts/brute_force_e4m3_division.c -lm && ./a.out
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static float from_bits(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof(value));
    return value;
}

static float divide_by_scale(float x, float divisor, float reciprocal) {
    const float quotient = x * reciprocal;
    const float residual = fmaf(quotient, divisor, -x);
    return fmaf(-residual, reciprocal, quotient);
}

static uint32_t to_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof(bits));
    return bits;
}

int main(void) {
    long checked = 0, differences = 0;
    for (uint32_t divisor_bits = 0x3f800000u; divisor_bits < 0x40000000u; ++divisor_bits) {
        const float divisor = from_bits(divisor_bits), reciprocal = 1.0f / divisor;
        for (int k = 16; k < 32; ++k) {
            const float center = (k / 16.0f) * divisor;
            for (int step = -4; step <= 4; ++step) {
                const float x = from_bits(to_bits(center) + step);
                const float q = divide_by_scale(x, divisor, reciprocal);
                ++checked;
                if (q != x / divisor && ++differences <= 10)
                    printf("divisor %a x %a: %a, IEEE %a\n", divisor, x, q, x / divisor);
            }
        }
    }
    for (uint32_t bits = 0x01000000u; bits < 0x7f800000u; ++bits) {  // 2^-125 up
        const float x = from_bits(bits), q = divide_by_scale(x, 6.0f, 1.0f / 6.0f);
        ++checked;
        if (q != x / 6.0f && ++differences <= 20)
            printf("x %a / 6: %a, IEEE %a\n", x, q, x / 6.0f);
    }
    printf("%ld cases, %ld differences\n", checked, differences);
    return differences != 0;
}
