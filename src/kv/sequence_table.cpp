#include "kv/sequence_table.h"

#include <fmt/format.h>

namespace swarmkv::detail {

SequenceTable::SequenceTable(KvOps& kv, int32_t n_seqs, bool keep_cells)
    : kv_(kv), keep_cells_(keep_cells) {
  if (n_seqs < 1) {
    throw Error(ErrorCode::kInternal, fmt::format("sequence table: {} sequences", n_seqs));
  }
  seqs_.resize(static_cast<size_t>(n_seqs));
}

std::vector<uint32_t>& SequenceTable::cells_of(SeqId seq) {
  if (seq < 0 || seq >= sequences()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("sequence table: sequence {} outside 0..{}", seq, sequences() - 1));
  }
  return seqs_[static_cast<size_t>(seq)];
}

const std::vector<uint32_t>& SequenceTable::cells_of(SeqId seq) const {
  return const_cast<SequenceTable*>(this)->cells_of(seq);
}

size_t SequenceTable::length(SeqId seq) const {
  return cells_of(seq).size();
}

void SequenceTable::decoded(SeqId seq, size_t n) {
  std::vector<uint32_t>& cells = cells_of(seq);
  for (size_t k = 0; k < n; ++k) {
    refs_[next_cell_] = 1;
    cells.push_back(next_cell_++);
  }
  frontier_ += n;
}

void SequenceTable::fork(SeqId dst, SeqId src, size_t len) {
  const std::vector<uint32_t>& from = cells_of(src);
  std::vector<uint32_t>& to = cells_of(dst);
  if (dst == src || !to.empty() || len > from.size()) {
    throw Error(ErrorCode::kInternal,
                fmt::format("sequence table: fork of {} positions from sequence {} ({} held) "
                            "into sequence {} ({} held)",
                            len, src, from.size(), dst, to.size()));
  }
  if (len == 0) return;
  // A whole sequence is copied whatever positions it holds.
  kv_.seq_cp(src, dst, -1, len == from.size() ? -1 : static_cast<Pos>(len));
  to.assign(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(len));
  for (const uint32_t id : to) ++refs_[id];
}

void SequenceTable::drop(std::vector<uint32_t>& cells) {
  for (const uint32_t id : cells) {
    const auto it = refs_.find(id);
    if (--it->second == 0) refs_.erase(it);
  }
  cells.clear();
}

void SequenceTable::free(SeqId seq) {
  std::vector<uint32_t>& cells = cells_of(seq);
  if (keep_cells_ && !cells.empty()) kv_.seq_cp(seq, park(), -1, -1);
  kv_.seq_rm(seq);
  drop(cells);
}

void SequenceTable::start_over() {
  kv_.memory_clear();
  for (std::vector<uint32_t>& cells : seqs_) cells.clear();
  refs_.clear();
  frontier_ = 0;
}

}  // namespace swarmkv::detail
