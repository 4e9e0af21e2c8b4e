#include "server/stored_prefix.h"

#include <algorithm>

#include "prefix/prefix_source.h"
#include "swarmkv/log.h"

namespace swarmkv::server {

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
  const auto skip = [](const std::string&, const ErrorValue& error) {
    log_warn("snapshot store: skipping a damaged entry ({}); left it (read-only)",
             error.to_string());
  };
  // Never all of the prompt (its last token is decoded for its logits).
  // In exact mode (batch-invariant kernels) a row's result depends on its
  // cells' values and order only, and a restore keeps both: any length, on
  // sliding-window models too. Otherwise this is the cut to whole
  // micro-batches a pipeline's store lookup makes.
  const auto reusable = [&](size_t common, size_t have) {
    common = std::min(common, prompt.size() - 1);
    return exact_ ? common : detail::reusable_tokens(common, have, prompt.size(), binding_.layout);
  };
  const std::optional<detail::StoreHit> hit =
      detail::find_stored_prefix(store_, binding_, prompt, more_than + 1, reusable, skip);
  if (!hit || hit->reuse <= more_than) return std::nullopt;
  try {
    // The entry is a prefill context's whole state; its first `reuse` tokens
    // as one sequence's state.
    Context ctx(model_, detail::prefill_context_options(serving_, hit->have));
    detail::restore_cut(ctx, hit->payload, hit->have, hit->reuse, hit->entry.path);
    StoredPrefix out;
    out.tokens = hit->reuse;
    out.key = hit->entry.key;
    out.seq_state.resize(ctx.state_seq_size(0));
    out.seq_state.resize(ctx.state_seq_get(0, out.seq_state));
    return out;
  } catch (const Error& e) {
    if (!detail::store_entry_damaged(e)) throw;
    skip(hit->entry.path, e.value());
    return std::nullopt;
  }
}

}  // namespace swarmkv::server
