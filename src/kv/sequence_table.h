// A context's sequences as lists of KV cells: the one place that forks,
// frees and parks sequences for the shared fork and for `serve`'s
// completion engine. Pure bookkeeping over a KvOps (a Context in the
// engine, a recording fake in the unit tests).
//
// Each sequence holds one cell per decoded position, in position order; a
// fork gives the new sequence the first `len` cells of its source (llama.cpp
// seq_cp: the cells are shared, no KV byte moves). A cell is in use while
// any sequence holds it.
//
// keep_cells (exact mode): no cell may be emptied while any sequence is
// live, so that llama.cpp hands out cells in rising order and every
// sequence's cells lie in position order (the batch-invariant kernel then
// reads a row's cells in the order a re-prefill would). A freed sequence's
// cells go to one more sequence, the park, until start_over() empties the
// whole cache; the frontier counts the cells handed out since then, which
// is what limits admission.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"

namespace swarmkv::detail {

// The cache operations the table issues, named as llama.cpp's.
class KvOps {
 public:
  virtual ~KvOps() = default;
  // seq_cp(src, dst, p0, p1): dst also holds src's cells at positions [p0, p1).
  virtual void seq_cp(SeqId src, SeqId dst, Pos p0, Pos p1) = 0;
  virtual void seq_rm(SeqId seq) = 0;  // every cell of seq
  virtual void memory_clear() = 0;     // every cell of every sequence
};

// KvOps on a real context.
class ContextKv final : public KvOps {
 public:
  explicit ContextKv(Context& ctx) : ctx_(ctx) {}
  void seq_cp(SeqId src, SeqId dst, Pos p0, Pos p1) override { ctx_.seq_cp(src, dst, p0, p1); }
  void seq_rm(SeqId seq) override { ctx_.seq_rm(seq); }
  void memory_clear() override { ctx_.memory_clear(); }

 private:
  Context& ctx_;
};

class SequenceTable {
 public:
  // Sequences 0 .. n_seqs - 1; with keep_cells, sequence n_seqs is the park
  // (the context needs n_seqs + 1 sequences then). Throws Error(kInternal)
  // when n_seqs < 1.
  SequenceTable(KvOps& kv, int32_t n_seqs, bool keep_cells);

  int32_t sequences() const noexcept { return static_cast<int32_t>(seqs_.size()); }
  bool keeps_cells() const noexcept { return keep_cells_; }
  SeqId park() const noexcept { return keep_cells_ ? sequences() : -1; }

  // Positions `seq` holds (its next token's position).
  size_t length(SeqId seq) const;
  // `n` positions of `seq` were decoded, each into a new cell (after a
  // successful llama_decode; restored state counts the same).
  void decoded(SeqId seq, size_t n);
  // `dst` (empty) takes `src`'s first `len` cells (seq_cp of positions
  // [0, len), or of all of src when len is its length); len > length(src),
  // dst == src or a non-empty dst throw Error(kInternal).
  void fork(SeqId dst, SeqId src, size_t len);
  // Empties `seq` (keep_cells: its cells go to the park first).
  void free(SeqId seq);
  // Empties every sequence and the park; the frontier starts at 0 again.
  void start_over();

  // Distinct cells that sequences hold (the park's not counted).
  size_t cells_in_use() const noexcept { return refs_.size(); }
  // Cells handed out since construction or the last start_over().
  size_t frontier() const noexcept { return frontier_; }
  // What admission must count as taken: with keep_cells the frontier
  // (nothing is emptied until start_over), else the cells in use.
  size_t cells_taken() const noexcept { return keep_cells_ ? frontier_ : refs_.size(); }

 private:
  std::vector<uint32_t>& cells_of(SeqId seq);
  const std::vector<uint32_t>& cells_of(SeqId seq) const;
  void drop(std::vector<uint32_t>& cells);

  KvOps& kv_;
  bool keep_cells_;
  std::vector<std::vector<uint32_t>> seqs_;     // the cell of each decoded position
  std::unordered_map<uint32_t, int32_t> refs_;  // cell -> sequences holding it
  uint32_t next_cell_ = 0;
  size_t frontier_ = 0;
};

}  // namespace swarmkv::detail
