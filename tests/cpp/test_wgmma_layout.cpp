// The shared-memory layout of the warpgroup products (src/cuda/common/wgmma_layout.h) and the
// operands that the wgmma state pass and the fused pass form in it (src/cuda/chunked/
// state_pass_wgmma_layout.h, fused_pass_layout.h; the warp-specialised pass's uses), on
// the CPU: the tiles' 16-byte units land at consecutive bytes and cover each tile once, and every
// operand of every product reads, under the instruction's addressing (operand_byte), exactly the
// tile element the product needs. The addressing itself is the hardware's: CudaWgmma.Probe checks
// it on a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/chunked/fused_pass_layout.h"
#include "cuda/chunked/state_pass_wgmma_layout.h"
#include "cuda/common/wgmma_layout.h"

namespace gdr::test {
namespace {

using cuda::wgmma_layout::Operand;
using cuda::wgmma_layout::operand_byte;
using cuda::wgmma_layout::tile_offset;
using cuda::wgmma_layout::tile_unit;
namespace pass = cuda::chunked::wgmma_pass;

TEST(WgmmaLayout, TileUnitsAreConsecutiveAndCoverTheTile) {
  for (auto [rows, cols] : {std::pair{64, 128}, {64, 64}, {128, 32}, {64, 32}, {64, 16}}) {
    std::vector<int> seen(rows * cols, 0);
    for (int u = 0; u < rows * cols / 8; ++u) {
      const auto unit = tile_unit(u, cols);
      ASSERT_LT(unit.row, rows);
      ASSERT_EQ(unit.col % 8, 0);
      for (int e = 0; e < 8; ++e) {
        ASSERT_EQ(tile_offset(unit.row, unit.col + e, cols), 16u * u + 2u * e)
            << rows << "x" << cols << " unit " << u;
        ++seen[unit.row * cols + unit.col + e];
      }
    }
    for (int s : seen) ASSERT_EQ(s, 1) << rows << "x" << cols;
  }
}

// Every (mn, k) of an operand of extent mn_extent x 16 is read at the tile byte of want(mn, k).
template <class Want>
void expect_reads(const std::string& label, Operand d, bool mn_major, int mn_extent, Want want) {
  for (int mn = 0; mn < mn_extent; ++mn)
    for (int k = 0; k < 16; ++k)
      ASSERT_EQ(operand_byte(d, mn_major, mn, k), want(mn, k))
          << label << ": element (" << mn << ", " << k << ")";
}

TEST(WgmmaLayout, StatePassOperandsReadWhatTheyMean) {
  const int C = pass::kRows, Dk = pass::kDk, BV = pass::kBV, H = pass::kHalf;
  for (int wg = 0; wg < 2; ++wg) {
    for (int ks = 0; ks < Dk / 16; ++ks) {
      const std::string at = " wg " + std::to_string(wg) + " ks " + std::to_string(ks);
      // W S: A(m, k) = W[m][16 ks + k]; B(n, k) = S[16 ks + k][16 wg + n].
      expect_reads("W S, A" + at, pass::ws_a(ks), false, C,
                   [&](int m, int k) { return tile_offset(m, 16 * ks + k, Dk); });
      expect_reads("W S, B" + at, pass::ws_b(wg, ks), true, H,
                   [&](int n, int k) { return tile_offset(16 * ks + k, H * wg + n, BV); });
    }
    for (int ks = 0; ks < C / 16; ++ks) {
      const std::string at = " wg " + std::to_string(wg) + " ks " + std::to_string(ks);
      // k^T V: A(m, k) = k^T[64 wg + m][16 ks + k] = krows[16 ks + k][64 wg + m];
      // B(n, k) = V[16 ks + k][n].
      expect_reads("k^T V, A" + at, pass::kv_a(wg, ks), true, 64,
                   [&](int m, int k) { return tile_offset(16 * ks + k, 64 * wg + m, Dk); });
      expect_reads("k^T V, B" + at, pass::kv_b(ks), true, BV,
                   [&](int n, int k) { return tile_offset(16 * ks + k, n, BV); });
      // P Vnew: A(m, k) = P[m][16 ks + k]; B(n, k) = Vnew[16 ks + k][16 wg + n].
      expect_reads("P Vnew, A" + at, pass::pv_a(ks), false, C,
                   [&](int m, int k) { return tile_offset(m, 16 * ks + k, C); });
      expect_reads("P Vnew, B" + at, pass::pv_b(wg, ks), true, H,
                   [&](int n, int k) { return tile_offset(16 * ks + k, H * wg + n, BV); });
      // The reverse pass's P^T dO: A(m, k) = P^T[m][16 ks + k] = P[16 ks + k][m].
      expect_reads("P^T dO, A" + at, pass::pt_a(ks), true, C,
                   [&](int m, int k) { return tile_offset(16 * ks + k, m, C); });
    }
  }
}

// The warp-specialised pass (state_pass_ws_kernel.cuh) takes all 32 columns in each product: W S_b
// and Q S_b read S_b [Dk][BV] through kv_b over the Dk / 16 k steps (kv_b's other use, k^T V,
// takes C / 16 of them); P Vn reads Vn [C][BV] the same way.
TEST(WgmmaLayout, WarpSpecialisedPassOperandsReadWhatTheyMean) {
  const int Dk = pass::kDk, BV = pass::kBV;
  for (int ks = 0; ks < Dk / 16; ++ks)
    expect_reads("W S_b, B ks " + std::to_string(ks), pass::kv_b(ks), true, BV,
                 [&](int n, int k) { return tile_offset(16 * ks + k, n, BV); });
}

TEST(WgmmaLayout, FusedPassOperandsReadWhatTheyMean) {
  namespace fp = cuda::chunked::fused_pass;
  const int C = fp::kRows, D = fp::kD;
  for (int bv : {128, 64, 32}) {
    const int H = bv / 2;  // a warpgroup's columns in the C-row products
    for (int wg = 0; wg < 2; ++wg) {
      for (int ks = 0; ks < D / 16; ++ks) {
        const std::string at =
            " bv " + std::to_string(bv) + " wg " + std::to_string(wg) + " ks " + std::to_string(ks);
        // K S_b (and Q S_b): A(m, k) = krows[m][16 ks + k]; B(n, k) = S_b[16 ks + k][H wg + n].
        expect_reads("K S, A" + at, fp::rows_a(ks), false, C,
                     [&](int m, int k) { return tile_offset(m, 16 * ks + k, D); });
        expect_reads("K S, B" + at, fp::cols_b(bv, wg, ks), true, H,
                     [&](int n, int k) { return tile_offset(16 * ks + k, H * wg + n, bv); });
      }
      for (int ks = 0; ks < C / 16; ++ks) {
        const std::string at =
            " bv " + std::to_string(bv) + " wg " + std::to_string(wg) + " ks " + std::to_string(ks);
        // T~ Y (and P Vn): A(m, k) = T~[m][16 ks + k]; B(n, k) = Y[16 ks + k][H wg + n].
        expect_reads("T Y, A" + at, fp::cc_a(ks), false, C,
                     [&](int m, int k) { return tile_offset(m, 16 * ks + k, C); });
        expect_reads("T Y, B" + at, fp::cols_b(bv, wg, ks), true, H,
                     [&](int n, int k) { return tile_offset(16 * ks + k, H * wg + n, bv); });
        // K^T V: A(m, k) = K^T[64 wg + m][16 ks + k] = krows[16 ks + k][64 wg + m];
        // B(n, k) = V[16 ks + k][n], all bv columns.
        expect_reads("K^T V, A" + at, fp::update_a(wg, ks), true, 64,
                     [&](int m, int k) { return tile_offset(16 * ks + k, 64 * wg + m, D); });
        expect_reads("K^T V, B" + at, fp::update_b(bv, ks), true, bv,
                     [&](int n, int k) { return tile_offset(16 * ks + k, n, bv); });
      }
    }
  }
}

}  // namespace
}  // namespace gdr::test
