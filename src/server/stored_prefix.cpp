#include "server/stored_prefix.h"

#include <algorithm>

#include "prefix/prefix_source.h"
#include "swarmkv/log.h"

namespace swarmkv::server {
namespace {

bool damaged(const Error& e) {
  return e.code() == ErrorCode::kCorruption || e.code() == ErrorCode::kIo ||
         e.code() == ErrorCode::kNotFound;
}

}  // namespace

PrefixStore::PrefixStore(std::shared_ptr<const Model> model, const ContextOptions& serving,
                         std::string dir, bool exact)
    : exact_(exact),
      model_(std::move(model)),
      serving_(serving),
      binding_(detail::prefix_binding(*model_, serving)),
      store_(std::move(dir)) {}

std::optional<StoredPrefix> PrefixStore::find(std::span<const Token> prompt,
                                              size_t more_than) const {
  if (prompt.size() < 2) return std::nullopt;
  std::vector<SnapshotStore::Entry> bad;
  const std::optional<SnapshotStore::Match> match =
      store_.best_match(binding_, prompt, more_than + 1, &bad);
  for (const SnapshotStore::Entry& e : bad) {
    log_warn("snapshot store: skipping a damaged entry ({}); left it (read-only)",
             e.error->to_string());
  }
  if (!match) return std::nullopt;
  const size_t have = match->entry.header->meta.tokens.size();
  // Never all of the prompt (its last token is decoded for its logits).
  // In exact mode (batch-invariant kernels) a row's result depends on its
  // cells' values and order only, and a restore keeps both: any length, on
  // sliding-window models too. Otherwise this is the cut to whole
  // micro-batches a pipeline's store lookup makes.
  const size_t common = std::min(match->common_tokens, prompt.size() - 1);
  const size_t reuse =
      exact_ ? common : detail::reusable_tokens(common, have, prompt.size(), binding_.layout);
  if (reuse <= more_than) return std::nullopt;
  try {
    const std::vector<uint8_t> payload =
        read_snapshot_payload(match->entry.path, *match->entry.header);
    // The entry is a prefill context's whole state; its first `reuse` tokens
    // as one sequence's state.
    Context ctx(model_, detail::prefill_context_options(serving_, have));
    detail::restore_prefix(ctx, payload, have, match->entry.path);
    if (reuse < have) ctx.seq_rm(0, static_cast<Pos>(reuse), -1);
    StoredPrefix out;
    out.tokens = reuse;
    out.key = match->entry.key;
    out.seq_state.resize(ctx.state_seq_size(0));
    out.seq_state.resize(ctx.state_seq_get(0, out.seq_state));
    return out;
  } catch (const Error& e) {
    if (!damaged(e)) throw;
    log_warn("snapshot store: skipping a damaged entry ({}); left it (read-only)",
             e.value().to_string());
    return std::nullopt;
  }
}

}  // namespace swarmkv::server
