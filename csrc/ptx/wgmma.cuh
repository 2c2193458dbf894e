// wgmma wrappers: shared-memory matrix descriptors, fence/commit/wait, the FP8 (e4m3 x e4m3 -> f32)
// warpgroup MMA m64nNk32 with both operands K-major in shared memory, and the BF16 (bf16 x bf16 -> f32) one,
// m64nNk16, whose operands may also be MN-major.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/mbarrier.cuh"

namespace deep_kernels::ptx {

// The threads of a warpgroup, which issues one wgmma together.
constexpr uint32_t kNumThreadsPerWarpgroup = 128;

// Descriptor of a K-major tile of rows x 128 bytes that TMA wrote with the 128-byte swizzle: eight rows
// form one 1024-byte swizzle atom and atoms are stacked along M/N, so the stride-dimension offset is
// 1024 bytes; the leading-dimension offset is unused for swizzled K-major tiles. The tile must be
// 1024-byte aligned (base offset 0). Advancing K by 32 bytes inside the atom adds 2 to the descriptor.
DK_DEVICE uint64_t make_smem_desc_k_major_sw128(const void* smem_tile) {
    constexpr uint64_t kStrideBytes = 1024;
    constexpr uint64_t kSwizzle128B = 1;
    const uint64_t start = (smem_address(smem_tile) & 0x3FFFF) >> 4;
    return start | ((kStrideBytes >> 4) << 32) | (kSwizzle128B << 62);
}

// Descriptor of an MN-major 16-bit tile that TMA wrote with the 128-byte swizzle as boxes of 64 elements (128 bytes)
// of M or N by K rows, one box after another every box_bytes: a swizzle atom is 8 K rows of one box (1024 bytes), so
// the stride-dimension offset (the next 8 K rows) is 1024 bytes and the leading-dimension offset (the next 64
// elements of M or N) is box_bytes. 1024-byte aligned; advancing K by 16 rows adds 2048 bytes (128).
DK_DEVICE uint64_t make_smem_desc_mn_major_sw128(const void* smem_tile, uint32_t box_bytes) {
    constexpr uint64_t kStrideBytes = 1024;
    constexpr uint64_t kSwizzle128B = 1;
    const uint64_t start = (smem_address(smem_tile) & 0x3FFFF) >> 4;
    return start | (static_cast<uint64_t>((box_bytes & 0x3FFFF) >> 4) << 16) | ((kStrideBytes >> 4) << 32) |
           (kSwizzle128B << 62);
}

// Orders earlier register/shared-memory accesses before the wgmma instructions that follow.
DK_DEVICE void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

DK_DEVICE void wgmma_commit_group() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most kNumPending committed wgmma groups of this warp are in flight.
template <int kNumPending>
DK_DEVICE void wgmma_wait_group() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kNumPending) : "memory");
}

// Pins an accumulator register at this point so the compiler cannot move its uses across wgmma calls.
DK_DEVICE void fence_operand(float& reg) {
    asm volatile("" : "+f"(reg)::"memory");
}

template <uint32_t kNumRegisters>
DK_DEVICE void fence_operands(float (&regs)[kNumRegisters]) {
#pragma unroll
    for (uint32_t i = 0; i < kNumRegisters; ++i)
        fence_operand(regs[i]);
}

// Fp8Wgmma<N>::mma(desc_a, desc_b, d, accumulate): d (64 x N, N / 2 FP32 registers per thread in the
// wgmma accumulator layout) = A(64 x 32) * B(N x 32)^T + (accumulate ? d : 0).
template <uint32_t N>
struct Fp8Wgmma;

// NOTE: inline asm needs the operand list and its "%i" placeholders spelled out per N, so they are built
// from 8-register chunks. The descriptors and the accumulate flag are "+" operands (never written) so
// they take the fixed positions %0..%2 and the accumulators always start at %3.
#define DK_WGMMA_ACC_PLACEHOLDERS_1 "%3, %4, %5, %6, %7, %8, %9, %10"
#define DK_WGMMA_ACC_PLACEHOLDERS_2 DK_WGMMA_ACC_PLACEHOLDERS_1 ", %11, %12, %13, %14, %15, %16, %17, %18"
#define DK_WGMMA_ACC_PLACEHOLDERS_3 DK_WGMMA_ACC_PLACEHOLDERS_2 ", %19, %20, %21, %22, %23, %24, %25, %26"
#define DK_WGMMA_ACC_PLACEHOLDERS_4 DK_WGMMA_ACC_PLACEHOLDERS_3 ", %27, %28, %29, %30, %31, %32, %33, %34"
#define DK_WGMMA_ACC_PLACEHOLDERS_5 DK_WGMMA_ACC_PLACEHOLDERS_4 ", %35, %36, %37, %38, %39, %40, %41, %42"
#define DK_WGMMA_ACC_PLACEHOLDERS_6 DK_WGMMA_ACC_PLACEHOLDERS_5 ", %43, %44, %45, %46, %47, %48, %49, %50"
#define DK_WGMMA_ACC_PLACEHOLDERS_7 DK_WGMMA_ACC_PLACEHOLDERS_6 ", %51, %52, %53, %54, %55, %56, %57, %58"
#define DK_WGMMA_ACC_PLACEHOLDERS_8 DK_WGMMA_ACC_PLACEHOLDERS_7 ", %59, %60, %61, %62, %63, %64, %65, %66"
#define DK_WGMMA_ACC_PLACEHOLDERS_9 DK_WGMMA_ACC_PLACEHOLDERS_8 ", %67, %68, %69, %70, %71, %72, %73, %74"
#define DK_WGMMA_ACC_PLACEHOLDERS_10 DK_WGMMA_ACC_PLACEHOLDERS_9 ", %75, %76, %77, %78, %79, %80, %81, %82"
#define DK_WGMMA_ACC_PLACEHOLDERS_11 DK_WGMMA_ACC_PLACEHOLDERS_10 ", %83, %84, %85, %86, %87, %88, %89, %90"
#define DK_WGMMA_ACC_PLACEHOLDERS_12 DK_WGMMA_ACC_PLACEHOLDERS_11 ", %91, %92, %93, %94, %95, %96, %97, %98"
#define DK_WGMMA_ACC_PLACEHOLDERS_13 DK_WGMMA_ACC_PLACEHOLDERS_12 ", %99, %100, %101, %102, %103, %104, %105, %106"
#define DK_WGMMA_ACC_PLACEHOLDERS_14 DK_WGMMA_ACC_PLACEHOLDERS_13 ", %107, %108, %109, %110, %111, %112, %113, %114"
#define DK_WGMMA_ACC_PLACEHOLDERS_15 DK_WGMMA_ACC_PLACEHOLDERS_14 ", %115, %116, %117, %118, %119, %120, %121, %122"
#define DK_WGMMA_ACC_PLACEHOLDERS_16 DK_WGMMA_ACC_PLACEHOLDERS_15 ", %123, %124, %125, %126, %127, %128, %129, %130"

#define DK_WGMMA_ACC_CHUNK(d, j) \
    "+f"(d[8 * (j) + 0]), "+f"(d[8 * (j) + 1]), "+f"(d[8 * (j) + 2]), "+f"(d[8 * (j) + 3]), \
        "+f"(d[8 * (j) + 4]), "+f"(d[8 * (j) + 5]), "+f"(d[8 * (j) + 6]), "+f"(d[8 * (j) + 7])
#define DK_WGMMA_ACC_OPERANDS_1(d) DK_WGMMA_ACC_CHUNK(d, 0)
#define DK_WGMMA_ACC_OPERANDS_2(d) DK_WGMMA_ACC_OPERANDS_1(d), DK_WGMMA_ACC_CHUNK(d, 1)
#define DK_WGMMA_ACC_OPERANDS_3(d) DK_WGMMA_ACC_OPERANDS_2(d), DK_WGMMA_ACC_CHUNK(d, 2)
#define DK_WGMMA_ACC_OPERANDS_4(d) DK_WGMMA_ACC_OPERANDS_3(d), DK_WGMMA_ACC_CHUNK(d, 3)
#define DK_WGMMA_ACC_OPERANDS_5(d) DK_WGMMA_ACC_OPERANDS_4(d), DK_WGMMA_ACC_CHUNK(d, 4)
#define DK_WGMMA_ACC_OPERANDS_6(d) DK_WGMMA_ACC_OPERANDS_5(d), DK_WGMMA_ACC_CHUNK(d, 5)
#define DK_WGMMA_ACC_OPERANDS_7(d) DK_WGMMA_ACC_OPERANDS_6(d), DK_WGMMA_ACC_CHUNK(d, 6)
#define DK_WGMMA_ACC_OPERANDS_8(d) DK_WGMMA_ACC_OPERANDS_7(d), DK_WGMMA_ACC_CHUNK(d, 7)
#define DK_WGMMA_ACC_OPERANDS_9(d) DK_WGMMA_ACC_OPERANDS_8(d), DK_WGMMA_ACC_CHUNK(d, 8)
#define DK_WGMMA_ACC_OPERANDS_10(d) DK_WGMMA_ACC_OPERANDS_9(d), DK_WGMMA_ACC_CHUNK(d, 9)
#define DK_WGMMA_ACC_OPERANDS_11(d) DK_WGMMA_ACC_OPERANDS_10(d), DK_WGMMA_ACC_CHUNK(d, 10)
#define DK_WGMMA_ACC_OPERANDS_12(d) DK_WGMMA_ACC_OPERANDS_11(d), DK_WGMMA_ACC_CHUNK(d, 11)
#define DK_WGMMA_ACC_OPERANDS_13(d) DK_WGMMA_ACC_OPERANDS_12(d), DK_WGMMA_ACC_CHUNK(d, 12)
#define DK_WGMMA_ACC_OPERANDS_14(d) DK_WGMMA_ACC_OPERANDS_13(d), DK_WGMMA_ACC_CHUNK(d, 13)
#define DK_WGMMA_ACC_OPERANDS_15(d) DK_WGMMA_ACC_OPERANDS_14(d), DK_WGMMA_ACC_CHUNK(d, 14)
#define DK_WGMMA_ACC_OPERANDS_16(d) DK_WGMMA_ACC_OPERANDS_15(d), DK_WGMMA_ACC_CHUNK(d, 15)

#define DK_DEFINE_FP8_WGMMA(N, CHUNKS)                                                                  \
    template <>                                                                                       \
    struct Fp8Wgmma<N> {                                                                              \
        DK_DEVICE static void mma(uint64_t desc_a, uint64_t desc_b, float (&d)[(N) / 2], uint32_t accumulate) { \
            asm volatile(                                                                             \
                "{\n"                                                                                 \
                ".reg .pred scale_d;\n"                                                               \
                "setp.ne.b32 scale_d, %2, 0;\n"                                                       \
                "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 "                           \
                "{" DK_WGMMA_ACC_PLACEHOLDERS_##CHUNKS "}, %0, %1, scale_d, 1, 1;\n"                  \
                "}"                                                                                   \
                : "+l"(desc_a), "+l"(desc_b), "+r"(accumulate), DK_WGMMA_ACC_OPERANDS_##CHUNKS(d));   \
        }                                                                                             \
    };

DK_DEFINE_FP8_WGMMA(16, 1)
DK_DEFINE_FP8_WGMMA(32, 2)
DK_DEFINE_FP8_WGMMA(48, 3)
DK_DEFINE_FP8_WGMMA(64, 4)
DK_DEFINE_FP8_WGMMA(80, 5)
DK_DEFINE_FP8_WGMMA(96, 6)
DK_DEFINE_FP8_WGMMA(112, 7)
DK_DEFINE_FP8_WGMMA(128, 8)
DK_DEFINE_FP8_WGMMA(144, 9)
DK_DEFINE_FP8_WGMMA(160, 10)
DK_DEFINE_FP8_WGMMA(176, 11)
DK_DEFINE_FP8_WGMMA(192, 12)
DK_DEFINE_FP8_WGMMA(208, 13)
DK_DEFINE_FP8_WGMMA(224, 14)
DK_DEFINE_FP8_WGMMA(240, 15)
DK_DEFINE_FP8_WGMMA(256, 16)

// Bf16Wgmma<N, kTransposeA, kTransposeB>::mma(desc_a, desc_b, d, accumulate): d (64 x N FP32, as Fp8Wgmma) =
// A(64 x 16) * B(N x 16)^T + (accumulate ? d : 0), bf16 operands in shared memory, K-major unless transposed
// (the descriptor's tile is then MN-major).
template <uint32_t N, bool kTransposeA = false, bool kTransposeB = false>
struct Bf16Wgmma;

#define DK_BF16_WGMMA_ASM(N, CHUNKS, TRANSPOSE)                                                        \
    asm volatile(                                                                                     \
        "{\n"                                                                                         \
        ".reg .pred scale_d;\n"                                                                       \
        "setp.ne.b32 scale_d, %2, 0;\n"                                                               \
        "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "                                   \
        "{" DK_WGMMA_ACC_PLACEHOLDERS_##CHUNKS "}, %0, %1, scale_d, 1, 1, " TRANSPOSE ";\n"          \
        "}"                                                                                           \
        : "+l"(desc_a), "+l"(desc_b), "+r"(accumulate), DK_WGMMA_ACC_OPERANDS_##CHUNKS(d))

#define DK_DEFINE_BF16_WGMMA(N, CHUNKS)                                                                 \
    template <bool kTransposeA, bool kTransposeB>                                                     \
    struct Bf16Wgmma<N, kTransposeA, kTransposeB> {                                                   \
        DK_DEVICE static void mma(uint64_t desc_a, uint64_t desc_b, float (&d)[(N) / 2], uint32_t accumulate) { \
            if constexpr (!kTransposeA && !kTransposeB)                                               \
                DK_BF16_WGMMA_ASM(N, CHUNKS, "0, 0");                                                 \
            else if constexpr (kTransposeA && !kTransposeB)                                           \
                DK_BF16_WGMMA_ASM(N, CHUNKS, "1, 0");                                                 \
            else if constexpr (!kTransposeA && kTransposeB)                                           \
                DK_BF16_WGMMA_ASM(N, CHUNKS, "0, 1");                                                 \
            else                                                                                      \
                DK_BF16_WGMMA_ASM(N, CHUNKS, "1, 1");                                                 \
        }                                                                                             \
    };

DK_DEFINE_BF16_WGMMA(16, 1)
DK_DEFINE_BF16_WGMMA(32, 2)
DK_DEFINE_BF16_WGMMA(48, 3)
DK_DEFINE_BF16_WGMMA(64, 4)
DK_DEFINE_BF16_WGMMA(80, 5)
DK_DEFINE_BF16_WGMMA(96, 6)
DK_DEFINE_BF16_WGMMA(112, 7)
DK_DEFINE_BF16_WGMMA(128, 8)
DK_DEFINE_BF16_WGMMA(144, 9)
DK_DEFINE_BF16_WGMMA(160, 10)
DK_DEFINE_BF16_WGMMA(176, 11)
DK_DEFINE_BF16_WGMMA(192, 12)
DK_DEFINE_BF16_WGMMA(208, 13)
DK_DEFINE_BF16_WGMMA(224, 14)
DK_DEFINE_BF16_WGMMA(240, 15)
DK_DEFINE_BF16_WGMMA(256, 16)

#undef DK_DEFINE_BF16_WGMMA
#undef DK_BF16_WGMMA_ASM
#undef DK_DEFINE_FP8_WGMMA
#undef DK_WGMMA_ACC_CHUNK
#undef DK_WGMMA_ACC_PLACEHOLDERS_1
#undef DK_WGMMA_ACC_PLACEHOLDERS_2
#undef DK_WGMMA_ACC_PLACEHOLDERS_3
#undef DK_WGMMA_ACC_PLACEHOLDERS_4
#undef DK_WGMMA_ACC_PLACEHOLDERS_5
#undef DK_WGMMA_ACC_PLACEHOLDERS_6
#undef DK_WGMMA_ACC_PLACEHOLDERS_7
#undef DK_WGMMA_ACC_PLACEHOLDERS_8
#undef DK_WGMMA_ACC_PLACEHOLDERS_9
#undef DK_WGMMA_ACC_PLACEHOLDERS_10
#undef DK_WGMMA_ACC_PLACEHOLDERS_11
#undef DK_WGMMA_ACC_PLACEHOLDERS_12
#undef DK_WGMMA_ACC_PLACEHOLDERS_13
#undef DK_WGMMA_ACC_PLACEHOLDERS_14
#undef DK_WGMMA_ACC_PLACEHOLDERS_15
#undef DK_WGMMA_ACC_PLACEHOLDERS_16
#undef DK_WGMMA_ACC_OPERANDS_1
#undef DK_WGMMA_ACC_OPERANDS_2
#undef DK_WGMMA_ACC_OPERANDS_3
#undef DK_WGMMA_ACC_OPERANDS_4
#undef DK_WGMMA_ACC_OPERANDS_5
#undef DK_WGMMA_ACC_OPERANDS_6
#undef DK_WGMMA_ACC_OPERANDS_7
#undef DK_WGMMA_ACC_CHUNK
#undef DK_WGMMA_ACC_OPERANDS_9
#undef DK_WGMMA_ACC_OPERANDS_10
#undef DK_WGMMA_ACC_OPERANDS_11
#undef DK_WGMMA_ACC_OPERANDS_12
#undef DK_WGMMA_ACC_OPERANDS_13
#undef DK_WGMMA_ACC_OPERANDS_14
#undef DK_WGMMA_ACC_OPERANDS_15
#undef DK_WGMMA_ACC_OPERANDS_16

}  // namespace deep_kernels::ptx
