// Edits of a snapshot's payload (llama.cpp's whole-context state) that a
// hostile writer could make and reseal with valid checksums, shared by the
// model tests and the cluster's (swarmkv_test_move_cells).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace swarmkv::test {

// Moves every cell of a one-sequence SmolLM2 ("llama") payload one position
// on: "llama" (4 + 5 bytes), n_stream, cell_count, then per cell pos (i32),
// n_seq_id (u32) = 1, seq id (i32) = 0. Returns the cell count; throws
// std::runtime_error when the payload is not laid out so.
inline uint32_t move_cells_one_position_on(std::vector<uint8_t>& payload) {
  const auto u32 = [&](size_t at) {
    if (at + 4 > payload.size()) throw std::runtime_error("the payload ends early");
    return uint32_t{payload[at]} | uint32_t{payload[at + 1]} << 8 |
           uint32_t{payload[at + 2]} << 16 | uint32_t{payload[at + 3]} << 24;
  };
  if (u32(0) != 5 || std::string(payload.begin() + 4, payload.begin() + 9) != "llama")
    throw std::runtime_error("not a payload of a 'llama' architecture model");
  const uint32_t cells = u32(13);
  for (uint32_t i = 0; i < cells; ++i) {
    const size_t at = 17 + 12 * size_t{i};
    if (u32(at) != i || u32(at + 4) != 1)
      throw std::runtime_error("cell " + std::to_string(i) + " is not at position " +
                               std::to_string(i) + " of one sequence");
    payload[at] = static_cast<uint8_t>(payload[at] + 1);
    if (payload[at] == 0) ++payload[at + 1];  // the carry (positions < 65535 here)
  }
  return cells;
}

}  // namespace swarmkv::test
