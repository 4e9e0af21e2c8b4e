// Where kShared and kHost get the document's KV state: a named snapshot
// file, the automatic store, or a prefill — in every case as the
// whole-context state of a "prefill context" (one sequence, not unified,
// n_batch = n_ubatch = the pipeline's n_batch), so that a snapshot made by
// one fork, one run or one machine means the same to every other.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "swarmkv/engine.h"
#include "swarmkv/snapshot.h"

namespace swarmkv::detail {

struct PrefixState {
  std::vector<uint8_t> bytes;  // Context::state_get of the prefill context
  SnapshotUse use;
  double prefill_ms = 0;  // decoding the tokens not restored
  double export_ms = 0;   // state_get after that decode
};

// The context a prefix of `n_tokens` tokens is prefilled in, from the
// engine settings of a run or a server (EngineSettings::context_options,
// the server's context): one sequence, not unified, n_ctx the next multiple of 256 above
// n_tokens. Every prefix snapshot is made in such a context, whoever makes
// or reads it.
ContextOptions prefill_context_options(const ContextOptions& engine, size_t n_tokens);
ContextOptions prefill_context_options(const EngineSettings& engine, size_t n_tokens);

// The binding of a prefix snapshot made with these engine settings on
// `model`: the one place a snapshot key's binding is assembled (run,
// prefill, serve, the coordinator and the workers all key by it).
SnapshotBinding prefix_binding(const Model& model, const ContextOptions& engine);
SnapshotBinding prefix_binding(const Model& model, const EngineSettings& engine);

// The metadata of a snapshot of `prefix` made with `engine` on `model`: its
// binding (prefix_binding), the tokens, the model's file name.
SnapshotMeta prefix_meta(const Model& model, const EngineSettings& engine,
                         const std::vector<Token>& prefix);

// How many leading tokens of a snapshot of `snapshot_tokens` tokens that
// shares `common` tokens with a prefix of `prefix_tokens` can be reused so
// that the result equals a prefill of the prefix bit for bit: all of them on
// an exact match; else `common` rounded down to a whole number of prefill
// chunks (n_ubatch), so that the rest is decoded in the chunks a prefill
// would use; 0 on sliding-window models (their state keeps only the last
// window, so a cut is not possible; see docs/snapshot-format.md).
size_t reusable_tokens(size_t common, size_t snapshot_tokens, size_t prefix_tokens,
                       const KvLayout& layout);

// Whether reading or restoring a store entry failed for damage to the
// entry itself (kCorruption, kIo, kNotFound): a warning and a skip, not a
// failure of the run or the request.
bool store_entry_damaged(const Error& e);

// A store entry whose first tokens a prefix or a prompt can take.
struct StoreHit {
  SnapshotStore::Entry entry;
  size_t have = 0;               // tokens the entry holds
  size_t common = 0;             // leading tokens it shares with the request
  size_t reuse = 0;              // of them, the ones that can be kept (the caller's rule)
  std::vector<uint8_t> payload;  // its state (a prefill context's), read when reuse >= at_least
  SnapshotReadTimes times;
};

// The one store lookup of `run`, `prefill` and `serve`: the entry of
// `binding` sharing the longest start with `tokens` (at least `at_least`
// tokens), how many of its tokens can be kept (`reusable(common, have)`),
// and its payload, read when that is at least `at_least`. Damaged entries,
// found in the scan or on reading, go to `on_damaged(path, error)` and are
// skipped. nullopt when no entry shares `at_least` tokens or the one that
// does is damaged; other errors are thrown.
std::optional<StoreHit> find_stored_prefix(
    const SnapshotStore& store, const SnapshotBinding& binding, std::span<const Token> tokens,
    size_t at_least, const std::function<size_t(size_t common, size_t have)>& reusable,
    const std::function<void(const std::string& path, const ErrorValue& error)>& on_damaged);

// After a prefix state was restored into `ctx`: sequence 0 holds positions
// 0 .. n_tokens - 1 (on a sliding-window model, the last of them up to
// n_tokens - 1). Otherwise Error(kCorruption) naming the snapshot file
// `path` ("": a state this process made): its checksums held, so its writer
// wrote cells in no sequence or at other positions, which llama.cpp takes
// as they are (an answer as if there were no document, or a decode error).
void check_restored_prefix(const Context& ctx, size_t n_tokens, const std::string& path);

// Before a prefix state of `n_tokens` is restored into `ctx`: its bytes
// list one KV stream of exactly n_tokens cells, the i-th at position i of
// sequence 0 alone, as a prefill leaves them (Context::read_state_cells).
// Otherwise Error(kCorruption) naming the snapshot file `path` as
// check_restored_prefix does: a state resealed with cells left out passed
// the position check after its restore (its lowest and highest position
// were there) and answered as if the document had holes.
void check_prefix_cells(const Context& ctx, std::span<const uint8_t> state, size_t n_tokens,
                        const std::string& path);

// Restores the prefix state of `n_tokens` tokens from snapshot file `path`
// ("": a state this process made) into `ctx`: check_prefix_cells,
// Context::state_set, check_restored_prefix. Throws what they throw; `ctx`
// is untouched after a failure of the first, empty after one of
// state_set, and holds what was restored after one of the last.
void restore_prefix(Context& ctx, std::span<const uint8_t> state, size_t n_tokens,
                    const std::string& path);

// restore_prefix of a state of `have` tokens, then only its first `keep`
// tokens kept on sequence 0 (a store entry longer than what reuses it).
void restore_cut(Context& ctx, std::span<const uint8_t> state, size_t have, size_t keep,
                 const std::string& path);

// Obtains the state of `prefix` with `engine`'s settings as `snapshot` says
// (see SnapshotOptions); `on_progress` (may be empty) as
// RunOptions::on_prefill_progress.
// Throws: for a named file what its reading throws (kNotFound, kCorruption,
// kIncompatible), kIncompatible when it shares no reusable tokens with the
// prefix; decode errors of the prefill. A damaged store entry is only a
// warning (use.discarded); failing to publish is only a warning.
// `exact_only`: without a snapshot of exactly this prefix, return no bytes
// (use: kPrefill, every token to prefill) instead of prefilling.
PrefixState obtain_prefix_state(const EngineSettings& engine, const std::vector<Token>& prefix,
                                const SnapshotOptions& snapshot,
                                const std::function<void(size_t, size_t)>& on_progress,
                                const std::shared_ptr<const Model>& model, bool exact_only = false);

// After the branch steps of a shared context `ctx` decoded all of `prefix`
// on sequence 0 themselves (a streamed prefill, for agents with `needs`):
// publishes that sequence's state to the store as a prefill context's state
// (Context::state_get_alone), the entry a plain prefill of `prefix` would
// publish, so that the next run restores it. Only where `snapshot.cache` is
// kOn, and only where those bytes are a prefill's: exact mode (batch-
// invariant rows), no sliding-window layers, and the document's cells in
// position order (a branch that finished during the prefill may have lent
// its freed cells to the document's later tokens); otherwise a log line and
// false. Sets use.published, use.path and use.bytes, and `export_ms`.
// Failing to publish is a warning (false).
bool publish_streamed_prefix(Context& ctx, const EngineSettings& engine,
                             const std::vector<Token>& prefix, const SnapshotOptions& snapshot,
                             SnapshotUse& use, double& export_ms);

}  // namespace swarmkv::detail
