// The shared-memory layout of bf16 warpgroup-product operands without swizzling, as plain constexpr
// C++ (host and device): where a tile stores each element, which bytes an instruction reads for
// an operand described by (start, LBO, SBO), and the operand descriptions of sub-blocks of a tile.
// The kernels (wgmma.cuh and its users) and a CPU test (tests/cpp/test_wgmma_layout.cpp: every
// operand a kernel forms reads the elements it means) share these functions; the GPU test
// CudaWgmma.Probe checks the model of the instruction against the hardware.
//
// The instruction's view (PTX ISA "Shared Memory Matrix Layout", no swizzling; CUTLASS's GMMA
// INTERLEAVE canonical layouts), in 16-byte units of 8 bf16 elements: a core matrix is 8 rows of
// one unit each, 128 contiguous bytes. Element (mn, k) of an operand (mn: the row of A, M, or the
// column of B, N) is read at
//   K-major  (8 consecutive k in a unit):  (mn % 8) * 16 + (mn / 8) * SBO + (k % 8) * 2 + (k / 8) *
//   LBO MN-major (8 consecutive mn in a unit): (mn % 8) * 2 + (mn / 8) * SBO + (k % 8) * 16 + (k /
//   8) * LBO
// past the start address: SBO steps between 8-groups of mn, LBO between 8-groups of k.
//
// A tile [rows][cols] here stores element (r, c) at
//   tile_offset(r, c, cols) = (r % 8) * 16 + (c % 8) * 2 + (c / 8) * 128 + (r / 8) * cols * 16,
// the core matrices of an 8-row group side by side along the columns. Read with rows = mn and
// cols = k it is a K-major operand (LBO 128, SBO 16 cols); read with rows = k and cols = mn an
// MN-major one (LBO 16 cols, SBO 128). So one staging of a row-major [rows][cols] source serves
// both: W or q rows as the A of W S (K-major), k rows as the transposed A of k^T V (MN-major).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GDR_HOST_DEVICE __host__ __device__
#else
#define GDR_HOST_DEVICE
#endif

namespace gdr::cuda::wgmma_layout {

// Byte of element (r, c) of a bf16 tile [rows][cols] (cols a multiple of 8).
GDR_HOST_DEVICE constexpr std::uint32_t tile_offset(int r, int c, int cols) {
  return static_cast<std::uint32_t>((r % 8) * 16 + (c % 8) * 2 + (c / 8) * 128 +
                                    (r / 8) * cols * 16);
}

// The 16-byte unit u of a tile (8 consecutive elements of one row, from a column that is a
// multiple of 8) is stored at byte 16 u: consecutive threads copying consecutive units write
// consecutive bytes (no bank conflicts), 8 rows of one column group, then the next column group.
struct Unit {
  int row, col;
};
GDR_HOST_DEVICE constexpr Unit tile_unit(int u, int cols) {
  const int groups = cols / 8;  // column groups per 8-row group
  const int band = u / (8 * groups), rest = u - band * 8 * groups;
  return Unit{8 * band + rest % 8, 8 * (rest / 8)};
}

// One operand of one instruction: its start byte in the tile and the two strides.
struct Operand {
  std::uint32_t start, lbo, sbo;
};

// The byte the instruction reads for element (mn, k) of the operand.
GDR_HOST_DEVICE constexpr std::uint32_t operand_byte(Operand d, bool mn_major, int mn, int k) {
  return mn_major ? d.start + (mn % 8) * 2 + (mn / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo
                  : d.start + (mn % 8) * 16 + (mn / 8) * d.sbo + (k % 8) * 2 + (k / 8) * d.lbo;
}

// The K-major operand whose element (mn, k) is tile element (mn0 + mn, k0 + k) of a tile with
// `cols` columns (rows = mn, cols = k); mn0, k0 multiples of 8.
GDR_HOST_DEVICE constexpr Operand kmajor_operand(int cols, int mn0, int k0) {
  return Operand{tile_offset(mn0, k0, cols), 128u, static_cast<std::uint32_t>(cols * 16)};
}
// The MN-major operand whose element (mn, k) is tile element (k0 + k, mn0 + mn) (rows = k,
// cols = mn); k0, mn0 multiples of 8.
GDR_HOST_DEVICE constexpr Operand mnmajor_operand(int cols, int k0, int mn0) {
  return Operand{tile_offset(k0, mn0, cols), static_cast<std::uint32_t>(cols * 16), 128u};
}

}  // namespace gdr::cuda::wgmma_layout
