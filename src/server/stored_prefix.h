// Chat completions whose prompt starts with a document prefix the snapshot
// store holds (made by `swarmkv run`, `prefill` or a posted pipeline with
// the same model and engine settings) restore that prefix instead of
// prefilling it. Read only: the server never writes the store for them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "swarmkv/engine.h"
#include "swarmkv/snapshot.h"

namespace swarmkv::server {

struct StoredPrefix {
  size_t tokens = 0;               // the prompt's first `tokens` tokens
  std::vector<uint8_t> seq_state;  // for Context::state_seq_set of the serving context
  std::string key;                 // the store entry's
};

// Thread-compatible: the engine thread alone uses it.
class PrefixStore {
 public:
  // `serving`: the options of the context restores go into; the store's
  // entries must have been made with the same engine settings (n_ubatch,
  // flash attention, KV types, batch-invariant kernels) on the same model
  // file. `exact`: the serving context is in exact mode (completion_engine.h).
  PrefixStore(std::shared_ptr<const Model> model, const ContextOptions& serving, std::string dir,
              bool exact);

  // The longest start of `prompt` the store holds, cut to whole micro-batches
  // (n_ubatch), so that the rest is decoded in the chunks a prefill of the
  // whole prompt would use (not in exact mode, which needs no cut), and to
  // at most prompt.size() - 1 tokens;
  // nullopt unless that is more than `more_than` tokens. A damaged entry is
  // a warning (left in place) and skipped; other errors are thrown.
  std::optional<StoredPrefix> find(std::span<const Token> prompt, size_t more_than) const;

 private:
  bool exact_;
  std::shared_ptr<const Model> model_;
  ContextOptions serving_;  // the server's engine settings (prefill_context_options)
  SnapshotBinding binding_;
  SnapshotStore store_;
};

}  // namespace swarmkv::server
