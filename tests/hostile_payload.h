// Edits of a snapshot's payload (llama.cpp's whole-context state) that a
// hostile writer could make and reseal with valid checksums, shared by the
// model tests and the cluster's (swarmkv_test_forge_cells).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace swarmkv::test {

namespace payload_detail {

inline uint64_t read_le(const std::vector<uint8_t>& payload, size_t at, size_t n) {
  if (at + n > payload.size()) throw std::runtime_error("the payload ends early");
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{payload[at + i]} << (8 * i);
  return v;
}

inline uint32_t u32(const std::vector<uint8_t>& payload, size_t at) {
  return static_cast<uint32_t>(read_le(payload, at, 4));
}

// The cell count of a one-sequence SmolLM2 ("llama") payload: "llama"
// (4 + 5 bytes), n_stream = 1, cell_count, then per cell pos (i32),
// n_seq_id (u32) = 1, seq id (i32) = 0.
inline uint32_t llama_cells(const std::vector<uint8_t>& payload) {
  if (u32(payload, 0) != 5 || payload.size() < 9 ||
      std::string(payload.begin() + 4, payload.begin() + 9) != "llama")
    throw std::runtime_error("not a payload of a 'llama' architecture model");
  if (u32(payload, 9) != 1) throw std::runtime_error("not a payload of one KV stream");
  return u32(payload, 13);
}

}  // namespace payload_detail

// Moves every cell of a one-sequence SmolLM2 payload one position on.
// Returns the cell count; throws std::runtime_error when the payload is not
// laid out so.
inline uint32_t move_cells_one_position_on(std::vector<uint8_t>& payload) {
  const uint32_t cells = payload_detail::llama_cells(payload);
  for (uint32_t i = 0; i < cells; ++i) {
    const size_t at = 17 + 12 * size_t{i};
    if (payload_detail::u32(payload, at) != i || payload_detail::u32(payload, at + 4) != 1)
      throw std::runtime_error("cell " + std::to_string(i) + " is not at position " +
                               std::to_string(i) + " of one sequence");
    payload[at] = static_cast<uint8_t>(payload[at] + 1);
    if (payload[at] == 0) ++payload[at + 1];  // the carry (positions < 65535 here)
  }
  return cells;
}

// Keeps the first and the last cell of a one-sequence SmolLM2 payload and
// their K and V rows, drops the rest: a state llama.cpp restores as it is,
// its lowest and highest positions where the document's are. After the
// cells (llama_kv_cache::state_write_data): v_trans, n_layer; per layer the
// K type (i32), row size (u64) and one row per cell; then per layer the V
// type and row size and one row per cell, or with v_trans the V type, its
// element size (u32), n_embd_v (u32) and per embedding value one element
// per cell. Returns the cell count it had.
inline uint32_t keep_first_and_last_cell(std::vector<uint8_t>& payload) {
  using payload_detail::read_le;
  using payload_detail::u32;
  const uint32_t cells = payload_detail::llama_cells(payload);
  if (cells < 3) throw std::runtime_error("fewer than 3 cells");
  std::vector<uint8_t> out(payload.begin(), payload.begin() + 13);
  const auto put = [&out](size_t at, size_t n, const std::vector<uint8_t>& from) {
    out.insert(out.end(), from.begin() + static_cast<std::ptrdiff_t>(at),
               from.begin() + static_cast<std::ptrdiff_t>(at + n));
  };
  const auto put_u32 = [&out](uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  // Of `cells` units of `unit` bytes from `at`: the first and the last.
  const auto put_ends = [&](size_t at, size_t unit) {
    if (at + cells * unit > payload.size()) throw std::runtime_error("the payload ends early");
    put(at, unit, payload);
    put(at + (cells - 1) * unit, unit, payload);
    return at + cells * unit;
  };
  put_u32(2);
  size_t at = put_ends(17, 12);
  const uint32_t v_trans = u32(payload, at);
  const uint32_t n_layer = u32(payload, at + 4);
  put(at, 8, payload);
  at += 8;
  for (uint32_t l = 0; l < n_layer; ++l) {  // K
    const size_t row = read_le(payload, at + 4, 8);
    put(at, 12, payload);
    at = put_ends(at + 12, row);
  }
  for (uint32_t l = 0; l < n_layer; ++l) {
    if (!v_trans) {
      const size_t row = read_le(payload, at + 4, 8);
      put(at, 12, payload);
      at = put_ends(at + 12, row);
      continue;
    }
    const uint32_t el = u32(payload, at + 4);
    const uint32_t n_embd = u32(payload, at + 8);
    put(at, 12, payload);
    at += 12;
    for (uint32_t j = 0; j < n_embd; ++j) at = put_ends(at, el);
  }
  if (at != payload.size()) throw std::runtime_error("bytes after the last layer's V");
  payload = std::move(out);
  return cells;
}

}  // namespace swarmkv::test
