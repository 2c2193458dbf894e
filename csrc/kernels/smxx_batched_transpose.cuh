// Batched transpose: x [B, M, N] (elements of kElementBytes = 1, 2 or 4 bytes: e4m3, bf16, fp32; last
// dimension contiguous, any batch and row strides) -> y [B, N, M] contiguous, y[b, n, m] = x[b, m, n], a
// pure move of bits. A CTA of 64 threads moves one TILE x TILE tile (128-byte rows both ways) through
// swizzled shared memory: TILE / 8 independent 16-byte loads per thread, then each thread gathers 16 bytes of
// one output row from kVec tile rows and writes them with one 16-byte store (e4m3: 4 x 4 byte blocks are
// transposed in registers, so shared memory moves 4-byte words in and 16-byte runs out). Any M and N: tiles past the
// edges are masked, and where rows are not whole 16-byte vectors (N, M or a stride not a multiple of kVec,
// or x not 16-byte aligned) the kernel moves single elements instead (the same tiles, slower).
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels {

namespace batched_transpose {

template <int kElementBytes> struct Element;
template <> struct Element<1> { using Type = uint8_t; };
template <> struct Element<2> { using Type = uint16_t; };
template <> struct Element<4> { using Type = uint32_t; };

}  // namespace batched_transpose

template <int kElementBytes>
__global__ void __launch_bounds__(64)
smxx_batched_transpose_impl(const void* __restrict__ x_base, void* __restrict__ y_base, uint32_t shape_m,
                            uint32_t shape_n, uint32_t x_batch_stride, uint32_t x_row_stride) {
    // Static checks and thread mapping: a 128-byte tile row is kChunks chunks of kVec elements; loads
    // take a row's chunks from neighbouring lanes, stores give an output row's chunks to neighbouring lanes
    using T = typename batched_transpose::Element<kElementBytes>::Type;
    constexpr int kVec = 16 / kElementBytes;
    constexpr int kChunks = 8;
    constexpr int TILE = kVec * kChunks;
    constexpr int kNumThreads = 64;
    constexpr int kVectorsPerThread = TILE * kChunks / kNumThreads;
    constexpr int kRowsPerStep = kNumThreads / kChunks;
    DK_STATIC_ASSERT(TILE % kRowsPerStep == 0, "the steps cover the tile's rows exactly");
    DK_STATIC_ASSERT(kElementBytes != 1 || TILE == kRowsPerStep * 4 * (kVectorsPerThread / 4),
                     "byte tiles are whole steps of four rows");

    // NOTE: the vector paths are chosen per launch from the arguments, so one binary serves every shape.
    const uint32_t batch = blockIdx.z, m_base = blockIdx.y * TILE, n_base = blockIdx.x * TILE;
    const T* x = static_cast<const T*>(x_base) + static_cast<uint64_t>(batch) * x_batch_stride;
    T* y = static_cast<T*>(y_base) + static_cast<uint64_t>(batch) * shape_n * shape_m;
    const bool vector_loads = shape_n % kVec == 0 && x_row_stride % kVec == 0 && x_batch_stride % kVec == 0 &&
                              reinterpret_cast<uintptr_t>(x_base) % 16 == 0;
    const bool vector_stores = shape_m % kVec == 0 && reinterpret_cast<uintptr_t>(y_base) % 16 == 0;

    // Loads first: kVectorsPerThread independent 16-byte loads per thread; outside x stays zero. Load i reads
    // tile row load_row(i): bytes take four consecutive rows per step (for the 4 x 4 transposes below)
    const auto load_row = [](int i) -> uint32_t {
        if constexpr (kElementBytes == 1)
            return (threadIdx.x / kChunks + i / 4 * kRowsPerStep) * 4 + i % 4;
        else
            return threadIdx.x / kChunks + i * kRowsPerStep;
    };
    uint4 loaded[kVectorsPerThread] = {};
    #pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
        const uint32_t m = m_base + load_row(i);
        const uint32_t n = n_base + threadIdx.x % kChunks * kVec;
        if (m >= shape_m || n >= shape_n)
            continue;
        const T* src = x + static_cast<uint64_t>(m) * x_row_stride + n;
        if (vector_loads) {
            loaded[i] = __ldg(reinterpret_cast<const uint4*>(src));
        } else {
            T* elements = reinterpret_cast<T*>(&loaded[i]);
            #pragma unroll
            for (int e = 0; e < kVec; ++e)
                elements[e] = n + e < shape_n ? src[e] : T(0);
        }
    }

    // Shared memory, 16 bytes per tile row chunk. Bytes: the tile transposed as 32-bit words, word (column, quad) =
    // the bytes of tile rows 4 quad .. 4 quad + 3 in column `column` (little-endian), at position quad ^ 4 (column
    // / 16 % 8) of the column's 32 words: a warp's word stores (8 chunks x 4 quads) hit 32 different banks, and
    // the XOR keeps each aligned run of 4 words together for the 16-byte reads. Wider elements: the input tile,
    // chunk c of row m at position c ^ (m / kVec) % kChunks, so that the lanes of a quarter-warp hit 8 different
    // bank groups when they store one row's chunks, and the lanes gathering one output row read 8 different
    // bank groups.
    // NOTE: single-byte shared-memory stores and gathers (16 of each per 16 bytes) held e4m3 at ~73% of copy
    // bandwidth; transposing 4 x 4 byte blocks in registers (8 byte permutes per 16 bytes) leaves one 4-byte
    // store per word and one 16-byte read per 16 output bytes.
    __shared__ uint4 smem_tile[TILE][kChunks];
    auto& smem_words = *reinterpret_cast<uint32_t (*)[TILE][TILE / 4]>(smem_tile);
    const auto word_position = [](uint32_t column, uint32_t quad) { return quad ^ column / 16 % 8 * 4; };
    const auto element_offset = [](uint32_t row, uint32_t column) {
        return (row * kChunks + ((column / kVec) ^ (row / kVec) % kChunks)) * kVec + column % kVec;
    };
    if constexpr (kElementBytes == 1) {
        #pragma unroll
        for (int step = 0; step < kVectorsPerThread / 4; ++step) {
            const uint32_t quad = threadIdx.x / kChunks + step * kRowsPerStep;
            const uint32_t* rows[4];
            #pragma unroll
            for (int r = 0; r < 4; ++r)
                rows[r] = reinterpret_cast<const uint32_t*>(&loaded[step * 4 + r]);
            #pragma unroll
            for (int w = 0; w < 4; ++w) {
                // Rows a, b, c, d of columns 4w .. 4w + 3 -> columns of rows: [a_j b_j c_j d_j] for j = 0 .. 3
                const uint32_t ab_low = __byte_perm(rows[0][w], rows[1][w], 0x5140);
                const uint32_t ab_high = __byte_perm(rows[0][w], rows[1][w], 0x7362);
                const uint32_t cd_low = __byte_perm(rows[2][w], rows[3][w], 0x5140);
                const uint32_t cd_high = __byte_perm(rows[2][w], rows[3][w], 0x7362);
                const uint32_t columns[4] = {__byte_perm(ab_low, cd_low, 0x5410), __byte_perm(ab_low, cd_low, 0x7632),
                                             __byte_perm(ab_high, cd_high, 0x5410),
                                             __byte_perm(ab_high, cd_high, 0x7632)};
                #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const uint32_t column = threadIdx.x % kChunks * kVec + w * 4 + j;
                    smem_words[column][word_position(column, quad)] = columns[j];
                }
            }
        }
    } else {
        #pragma unroll
        for (int i = 0; i < kVectorsPerThread; ++i) {
            const uint32_t row = load_row(i);
            smem_tile[row][(threadIdx.x % kChunks) ^ (row / kVec) % kChunks] = loaded[i];
        }
    }
    __syncthreads();

    // Gather and store: output row n_base + column, elements m_base + chunk * kVec + e (bytes: quads 4 chunk ..
    // 4 chunk + 3, one 16-byte read)
    #pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
        const uint32_t column = threadIdx.x / kChunks + i * kRowsPerStep, chunk = threadIdx.x % kChunks;
        const uint32_t n = n_base + column, m = m_base + chunk * kVec;
        if (n >= shape_n || m >= shape_m)
            continue;
        uint4 gathered;
        if constexpr (kElementBytes == 1) {
            gathered = *reinterpret_cast<const uint4*>(&smem_words[column][word_position(column, chunk * 4)]);
        } else {
            T* elements = reinterpret_cast<T*>(&gathered);
            const T* smem_elements = reinterpret_cast<const T*>(smem_tile);
            #pragma unroll
            for (int e = 0; e < kVec; ++e)
                elements[e] = smem_elements[element_offset(chunk * kVec + e, column)];
        }
        T* dst = y + static_cast<uint64_t>(n) * shape_m + m;
        if (vector_stores) {
            *reinterpret_cast<uint4*>(dst) = gathered;
        } else {
            const T* elements = reinterpret_cast<const T*>(&gathered);
            #pragma unroll
            for (int e = 0; e < kVec; ++e)
                if (m + e < shape_m)
                    dst[e] = elements[e];
        }
    }
}

}  // namespace deep_kernels
