// The FP8 warpgroup MMA with A from registers: wgmma m64nNk32 f32.e4m3.e4m3 whose A fragment (64 x 32 e4m3) is four
// 32-bit registers per thread and whose B is a K-major tile in shared memory (a descriptor, as ptx/wgmma.cuh's).
// A fragment of thread t of the warpgroup (warp w = t / 32, lane l, g = l / 4, q = l % 4): register 0 holds row
// 16w + g, columns 4q .. 4q + 3 (lowest byte first), register 1 row 16w + g + 8 of the same columns, registers 2
// and 3 the same rows at columns 16 + 4q .. 16 + 4q + 3.
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels::ptx {

// Fp8WgmmaRegisterA<N>::mma(a, desc_b, d, accumulate): d (64 x N, N / 2 FP32 registers per thread in the wgmma
// accumulator layout) = A(64 x 32, registers `a`) * B(N x 32)^T + (accumulate ? d : 0).
template <uint32_t N>
struct Fp8WgmmaRegisterA;

// NOTE: inline asm needs its operand list and "%i" placeholders spelled out per N (8-register chunks, as
// ptx/wgmma.cuh builds its own, which it undefines). The descriptor, the accumulate flag and the first A register
// take the fixed positions %0..%2 (as "+" operands), so the accumulators start at %3; the other three A registers
// follow them, at the positions given.
#define DK_RA_ACC_PLACEHOLDERS_1 "%3, %4, %5, %6, %7, %8, %9, %10"
#define DK_RA_ACC_PLACEHOLDERS_2 DK_RA_ACC_PLACEHOLDERS_1 ", %11, %12, %13, %14, %15, %16, %17, %18"
#define DK_RA_ACC_PLACEHOLDERS_3 DK_RA_ACC_PLACEHOLDERS_2 ", %19, %20, %21, %22, %23, %24, %25, %26"
#define DK_RA_ACC_PLACEHOLDERS_4 DK_RA_ACC_PLACEHOLDERS_3 ", %27, %28, %29, %30, %31, %32, %33, %34"
#define DK_RA_ACC_PLACEHOLDERS_5 DK_RA_ACC_PLACEHOLDERS_4 ", %35, %36, %37, %38, %39, %40, %41, %42"
#define DK_RA_ACC_PLACEHOLDERS_6 DK_RA_ACC_PLACEHOLDERS_5 ", %43, %44, %45, %46, %47, %48, %49, %50"
#define DK_RA_ACC_PLACEHOLDERS_7 DK_RA_ACC_PLACEHOLDERS_6 ", %51, %52, %53, %54, %55, %56, %57, %58"
#define DK_RA_ACC_PLACEHOLDERS_8 DK_RA_ACC_PLACEHOLDERS_7 ", %59, %60, %61, %62, %63, %64, %65, %66"
#define DK_RA_ACC_CHUNK(d, j) \
    "+f"(d[8 * (j) + 0]), "+f"(d[8 * (j) + 1]), "+f"(d[8 * (j) + 2]), "+f"(d[8 * (j) + 3]), \
        "+f"(d[8 * (j) + 4]), "+f"(d[8 * (j) + 5]), "+f"(d[8 * (j) + 6]), "+f"(d[8 * (j) + 7])
#define DK_RA_ACC_OPERANDS_1(d) DK_RA_ACC_CHUNK(d, 0)
#define DK_RA_ACC_OPERANDS_2(d) DK_RA_ACC_OPERANDS_1(d), DK_RA_ACC_CHUNK(d, 1)
#define DK_RA_ACC_OPERANDS_3(d) DK_RA_ACC_OPERANDS_2(d), DK_RA_ACC_CHUNK(d, 2)
#define DK_RA_ACC_OPERANDS_4(d) DK_RA_ACC_OPERANDS_3(d), DK_RA_ACC_CHUNK(d, 3)
#define DK_RA_ACC_OPERANDS_5(d) DK_RA_ACC_OPERANDS_4(d), DK_RA_ACC_CHUNK(d, 4)
#define DK_RA_ACC_OPERANDS_6(d) DK_RA_ACC_OPERANDS_5(d), DK_RA_ACC_CHUNK(d, 5)
#define DK_RA_ACC_OPERANDS_7(d) DK_RA_ACC_OPERANDS_6(d), DK_RA_ACC_CHUNK(d, 6)
#define DK_RA_ACC_OPERANDS_8(d) DK_RA_ACC_OPERANDS_7(d), DK_RA_ACC_CHUNK(d, 7)
#define DK_DEFINE_FP8_WGMMA_REGISTER_A(N, CHUNKS, A_REST)                                              \
    template <>                                                                                       \
    struct Fp8WgmmaRegisterA<N> {                                                                     \
        DK_DEVICE static void mma(const uint32_t (&a)[4], uint64_t desc_b, float (&d)[(N) / 2],       \
                                  uint32_t accumulate) {                                              \
            uint32_t a0 = a[0];                                                                       \
            asm volatile(                                                                             \
                "{\n"                                                                                 \
                ".reg .pred scale_d;\n"                                                               \
                "setp.ne.b32 scale_d, %1, 0;\n"                                                       \
                "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 "                           \
                "{" DK_RA_ACC_PLACEHOLDERS_##CHUNKS "}, {%2, " A_REST "}, %0, scale_d, 1, 1;\n"     \
                "}"                                                                                   \
                : "+l"(desc_b), "+r"(accumulate), "+r"(a0), DK_RA_ACC_OPERANDS_##CHUNKS(d)         \
                : "r"(a[1]), "r"(a[2]), "r"(a[3]));                                                   \
        }                                                                                             \
    };

DK_DEFINE_FP8_WGMMA_REGISTER_A(16, 1, "%11, %12, %13")
DK_DEFINE_FP8_WGMMA_REGISTER_A(32, 2, "%19, %20, %21")
DK_DEFINE_FP8_WGMMA_REGISTER_A(48, 3, "%27, %28, %29")
DK_DEFINE_FP8_WGMMA_REGISTER_A(64, 4, "%35, %36, %37")
DK_DEFINE_FP8_WGMMA_REGISTER_A(80, 5, "%43, %44, %45")
DK_DEFINE_FP8_WGMMA_REGISTER_A(96, 6, "%51, %52, %53")
DK_DEFINE_FP8_WGMMA_REGISTER_A(112, 7, "%59, %60, %61")
DK_DEFINE_FP8_WGMMA_REGISTER_A(128, 8, "%67, %68, %69")

// F16WgmmaRegisterA<N>::mma(a, desc_b, d, accumulate): the FP16 twin, wgmma m64nNk16 f32.f16.f16 with A (64 x 16 f16)
// in four registers per thread: register 0 holds row 16w + g, columns 2q and 2q + 1 (the lower column in the low
// half), register 1 row 16w + g + 8 of the same columns, registers 2 and 3 the same rows at columns 8 + 2q and
// 9 + 2q; B (N x 16 f16) K-major in shared memory.
template <uint32_t N>
struct F16WgmmaRegisterA;

#define DK_DEFINE_F16_WGMMA_REGISTER_A(N, CHUNKS, A_REST)                                              \
    template <>                                                                                       \
    struct F16WgmmaRegisterA<N> {                                                                     \
        DK_DEVICE static void mma(const uint32_t (&a)[4], uint64_t desc_b, float (&d)[(N) / 2],       \
                                  uint32_t accumulate) {                                              \
            uint32_t a0 = a[0];                                                                       \
            asm volatile(                                                                             \
                "{\n"                                                                                 \
                ".reg .pred scale_d;\n"                                                               \
                "setp.ne.b32 scale_d, %1, 0;\n"                                                       \
                "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.f16.f16 "                             \
                "{" DK_RA_ACC_PLACEHOLDERS_##CHUNKS "}, {%2, " A_REST "}, %0, scale_d, 1, 1, 0;\n"  \
                "}"                                                                                   \
                : "+l"(desc_b), "+r"(accumulate), "+r"(a0), DK_RA_ACC_OPERANDS_##CHUNKS(d)         \
                : "r"(a[1]), "r"(a[2]), "r"(a[3]));                                                   \
        }                                                                                             \
    };

DK_DEFINE_F16_WGMMA_REGISTER_A(16, 1, "%11, %12, %13")
DK_DEFINE_F16_WGMMA_REGISTER_A(32, 2, "%19, %20, %21")
DK_DEFINE_F16_WGMMA_REGISTER_A(48, 3, "%27, %28, %29")
DK_DEFINE_F16_WGMMA_REGISTER_A(64, 4, "%35, %36, %37")
DK_DEFINE_F16_WGMMA_REGISTER_A(80, 5, "%43, %44, %45")
DK_DEFINE_F16_WGMMA_REGISTER_A(96, 6, "%51, %52, %53")
DK_DEFINE_F16_WGMMA_REGISTER_A(112, 7, "%59, %60, %61")
DK_DEFINE_F16_WGMMA_REGISTER_A(128, 8, "%67, %68, %69")

#undef DK_DEFINE_F16_WGMMA_REGISTER_A
#undef DK_DEFINE_FP8_WGMMA_REGISTER_A
#undef DK_RA_ACC_CHUNK
#undef DK_RA_ACC_PLACEHOLDERS_1
#undef DK_RA_ACC_OPERANDS_1
#undef DK_RA_ACC_PLACEHOLDERS_2
#undef DK_RA_ACC_OPERANDS_2
#undef DK_RA_ACC_PLACEHOLDERS_3
#undef DK_RA_ACC_OPERANDS_3
#undef DK_RA_ACC_PLACEHOLDERS_4
#undef DK_RA_ACC_OPERANDS_4
#undef DK_RA_ACC_PLACEHOLDERS_5
#undef DK_RA_ACC_OPERANDS_5
#undef DK_RA_ACC_PLACEHOLDERS_6
#undef DK_RA_ACC_OPERANDS_6
#undef DK_RA_ACC_PLACEHOLDERS_7
#undef DK_RA_ACC_OPERANDS_7
#undef DK_RA_ACC_PLACEHOLDERS_8
#undef DK_RA_ACC_OPERANDS_8

}  // namespace deep_kernels::ptx
