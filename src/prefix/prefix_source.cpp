#include "prefix/prefix_source.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "swarmkv/log.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"

namespace swarmkv::detail {

ContextOptions prefill_context_options(const ContextOptions& engine, size_t n_tokens) {
  ContextOptions o = engine;
  o.n_ctx = static_cast<uint32_t>((n_tokens + 1 + 255) / 256 * 256);
  o.n_seq_max = 1;
  o.kv_unified = false;
  return o;
}

ContextOptions prefill_context_options(const EngineSettings& engine, size_t n_tokens) {
  return prefill_context_options(engine.context_options(), n_tokens);
}

SnapshotBinding prefix_binding(const Model& model, const ContextOptions& engine) {
  return binding_of(model, prefill_context_options(engine, 0));
}

SnapshotBinding prefix_binding(const Model& model, const EngineSettings& engine) {
  return prefix_binding(model, engine.context_options());
}

SnapshotMeta prefix_meta(const Model& model, const EngineSettings& engine,
                         const std::vector<Token>& prefix) {
  SnapshotMeta meta;
  meta.binding = prefix_binding(model, engine);
  meta.tokens = prefix;
  meta.model_file = std::filesystem::path(model.path()).filename().string();
  return meta;
}

size_t reusable_tokens(size_t common, size_t snapshot_tokens, size_t prefix_tokens,
                       const KvLayout& layout) {
  if (common == snapshot_tokens && common == prefix_tokens) return common;
  if (layout.n_swa > 0 || layout.n_ubatch == 0) return 0;
  return common / layout.n_ubatch * layout.n_ubatch;
}

namespace {

// What a snapshot file or the store gives a prefix: a state of `tokens`
// tokens whose first `reuse` it keeps (none: a prefill).
struct Found {
  std::vector<uint8_t> payload;
  size_t reuse = 0;
  size_t tokens = 0;
  SnapshotReadTimes times;
};

// The named snapshot file: any problem with it is the run's.
Found from_file(const std::string& file, const SnapshotBinding& binding,
                const std::vector<Token>& prefix, SnapshotUse& use) {
  const SnapshotHeader h = read_snapshot_header(file);
  check_binding(file, h.meta.binding, binding);
  const size_t common = common_prefix(h.meta.tokens, prefix);
  Found found;
  found.reuse = reusable_tokens(common, h.meta.tokens.size(), prefix.size(), binding.layout);
  if (found.reuse == 0) {
    throw Error(ErrorCode::kIncompatible,
                fmt::format("snapshot '{}' does not fit this document: it holds {} tokens, shares "
                            "the first {} with this prefix of {} tokens, and {}",
                            file, h.meta.tokens.size(), common, prefix.size(),
                            binding.layout.n_swa > 0
                                ? "a sliding-window model can reuse only an exact match"
                                : fmt::format("reuse needs at least one whole prefill chunk "
                                              "({} tokens)",
                                              binding.layout.n_ubatch)));
  }
  found.payload = read_snapshot_payload(file, h, &found.times);
  found.tokens = h.meta.tokens.size();
  use.source = SnapshotSource::kFile;
  use.path = file;
  return found;
}

// The store's best entry; a damaged one is removed (kOn) or left, and skipped.
Found from_store(SnapshotStore& store, SnapshotCacheMode mode, const SnapshotBinding& binding,
                 const std::vector<Token>& prefix, SnapshotUse& use) {
  const auto discard = [&](const std::string& path, const ErrorValue& error) {
    const bool remove = mode == SnapshotCacheMode::kOn;
    log_warn("snapshot cache: skipping a damaged entry ({}){}", error.to_string(),
             remove ? "; removed it" : "; left it (read-only)");
    if (remove) store.remove_path(path);
    use.discarded.push_back(error);
  };
  std::optional<StoreHit> hit = find_stored_prefix(
      store, binding, prefix, 1,
      [&](size_t common, size_t have) {
        return reusable_tokens(common, have, prefix.size(), binding.layout);
      },
      discard);
  Found found;
  if (!hit) return found;
  if (hit->reuse == 0) {
    log_info(
        "snapshot cache: {} shares {} of this prefix's {} tokens, not enough to reuse ({}); "
        "prefilling",
        hit->entry.key, hit->common, prefix.size(),
        binding.layout.n_swa > 0 ? "a sliding-window model reuses only an exact match"
                                 : "less than one prefill chunk");
    return found;
  }
  found.reuse = hit->reuse;
  found.payload = std::move(hit->payload);
  found.times = hit->times;
  found.tokens = hit->have;
  use.source = SnapshotSource::kCache;
  use.path = hit->entry.path;
  if (mode == SnapshotCacheMode::kOn) store.touch(hit->entry.path);
  return found;
}

// Publishes `bytes`, the prefix state `meta` describes, to `store`: sets
// use.published, and use.path where the prefix was prefilled. Failing is a
// warning: false.
bool publish_prefix(SnapshotStore& store, const SnapshotMeta& meta, std::span<const uint8_t> bytes,
                    SnapshotUse& use) {
  try {
    const std::string path = store.publish(meta, bytes);
    use.published = true;
    if (use.source == SnapshotSource::kPrefill) use.path = path;
    return true;
  } catch (const Error& err) {
    log_warn("snapshot cache: could not publish the prefix ({}); the run goes on", err.what());
    return false;
  }
}

// Decodes what `found` does not hold of `prefix` in a prefill context and
// exports the whole state into `out`.
void prefill_rest(const EngineSettings& engine, const std::vector<Token>& prefix, Found& found,
                  const std::function<void(size_t, size_t)>& on_progress,
                  const std::shared_ptr<const Model>& model, const Stopwatch& load,
                  PrefixState& out) {
  SnapshotUse& use = out.use;
  const size_t reuse = found.reuse;
  Context ctx(model,
              prefill_context_options(
                  engine, reuse > 0 ? std::max(prefix.size(), found.tokens) : prefix.size()));
  if (reuse > 0) {
    // Keep the first `reuse` tokens, then re-pack them: a whole-context
    // export skips the freed cells and a restore puts the rest at 0.., with
    // the head after them, as a prefill of those tokens leaves them.
    restore_cut(ctx, found.payload, found.tokens, reuse, use.path);
    std::vector<uint8_t> trimmed(ctx.state_size());
    trimmed.resize(ctx.state_get(trimmed));
    ctx.state_set(trimmed);
  } else {
    use.source = SnapshotSource::kPrefill;
    use.path.clear();
  }
  found.payload = {};
  use.reused_tokens = static_cast<int32_t>(reuse);
  use.prefilled_tokens = static_cast<int32_t>(prefix.size() - reuse);
  use.load_ms = reuse > 0 ? load.ms() : 0;

  const std::span<const Token> rest = std::span(prefix).subspan(reuse);
  std::function<void(size_t, size_t)> progress;
  if (on_progress) {
    progress = [&](size_t done, size_t) { on_progress(reuse + done, prefix.size()); };
  }
  const Stopwatch p;
  ctx.decode_prompt(rest, static_cast<Pos>(reuse), 0, /*logits_last=*/false, progress);
  out.prefill_ms = p.ms();
  const Stopwatch e;
  out.bytes.resize(ctx.state_size());  // the size comes from the live engine
  out.bytes.resize(ctx.state_get(out.bytes));
  out.export_ms = e.ms();
  use.bytes = out.bytes.size();
  log_info("prefix: {} tokens reused, {} prefilled in {:.1f} ms, state {} bytes", reuse,
           rest.size(), out.prefill_ms, use.bytes);
}

}  // namespace

PrefixState obtain_prefix_state(const EngineSettings& engine, const std::vector<Token>& prefix,
                                const SnapshotOptions& so,
                                const std::function<void(size_t, size_t)>& on_progress,
                                const std::shared_ptr<const Model>& model, bool exact_only) {
  PrefixState out;
  SnapshotUse& use = out.use;
  const Stopwatch load;
  const SnapshotBinding binding = prefix_binding(*model, engine);
  use.key = snapshot_key(binding, prefix);
  std::optional<SnapshotStore> store;
  if (so.cache != SnapshotCacheMode::kOff) {
    store.emplace(snapshot_store_dir(so.cache_dir), so.cache_max_bytes);
  }
  Found found = !so.file.empty() ? from_file(so.file, binding, prefix, use)
                : store          ? from_store(*store, so.cache, binding, prefix, use)
                                 : Found{};
  use.verify_ms = found.times.verify_ms;

  if (found.reuse == prefix.size() && found.tokens == prefix.size()) {  // an exact match
    out.bytes = std::move(found.payload);
    use.reused_tokens = static_cast<int32_t>(found.reuse);
    use.bytes = out.bytes.size();
    use.load_ms = load.ms();
    log_info("prefix: {} tokens restored from {} ({} bytes, {:.1f} ms)", found.reuse, use.path,
             use.bytes, use.load_ms);
    return out;
  }
  if (exact_only) {  // the caller prefills the whole prefix itself
    use.source = SnapshotSource::kPrefill;
    use.path.clear();
    use.prefilled_tokens = static_cast<int32_t>(prefix.size());
    return out;
  }
  prefill_rest(engine, prefix, found, on_progress, model, load, out);
  if (store && so.cache == SnapshotCacheMode::kOn) {
    publish_prefix(*store, prefix_meta(*model, engine, prefix), out.bytes, use);
  }
  return out;
}

bool publish_streamed_prefix(Context& ctx, const EngineSettings& engine,
                             const std::vector<Token>& prefix, const SnapshotOptions& so,
                             SnapshotUse& use, double& export_ms) {
  if (so.cache != SnapshotCacheMode::kOn) return false;
  const auto skip = [](std::string_view why) {
    log_info("prefix: the streamed prefill is not published to the snapshot store ({})", why);
    return false;
  };
  const SnapshotMeta meta = prefix_meta(ctx.model(), engine, prefix);
  const KvLayout& layout = meta.binding.layout;
  if (layout.n_swa > 0) {
    return skip("a sliding-window model's per-sequence export keeps only the window");
  }
  if (!layout.batch_invariant || !layout.attention_invariant) {
    return skip("outside exact mode the rows of a streamed prefill are not a prefill's");
  }
  const Stopwatch e;
  std::vector<uint8_t> bytes;
  try {
    bytes = ctx.state_get_alone(0);
    check_prefix_cells(ctx, bytes, prefix.size(), "");
  } catch (const Error& err) {  // e.g. a branch's freed cells took part of the document
    return skip(err.message());
  }
  export_ms = e.ms();
  const Stopwatch w;
  try {  // mid-run, among the agents' steps: nothing here may fail the run
    SnapshotStore store(snapshot_store_dir(so.cache_dir), so.cache_max_bytes);
    if (!publish_prefix(store, meta, bytes, use)) return false;
  } catch (const Error& err) {
    log_warn("snapshot cache: could not open the store to publish the prefix ({}); the run goes on",
             err.what());
    return false;
  }
  use.bytes = bytes.size();
  log_info(
      "prefix: the streamed prefill published to the snapshot store ({} bytes; export {:.1f} "
      "ms, write {:.1f} ms)",
      use.bytes, export_ms, w.ms());
  return true;
}

bool store_entry_damaged(const Error& e) {
  return e.code() == ErrorCode::kCorruption || e.code() == ErrorCode::kIo ||
         e.code() == ErrorCode::kNotFound;
}

std::optional<StoreHit> find_stored_prefix(
    const SnapshotStore& store, const SnapshotBinding& binding, std::span<const Token> tokens,
    size_t at_least, const std::function<size_t(size_t common, size_t have)>& reusable,
    const std::function<void(const std::string& path, const ErrorValue& error)>& on_damaged) {
  std::vector<SnapshotStore::Entry> bad;
  std::optional<SnapshotStore::Match> match = store.best_match(binding, tokens, at_least, &bad);
  for (const SnapshotStore::Entry& e : bad) on_damaged(e.path, *e.error);
  if (!match) return std::nullopt;
  StoreHit hit;
  hit.have = match->entry.header->meta.tokens.size();
  hit.common = match->common_tokens;
  hit.reuse = reusable(hit.common, hit.have);
  hit.entry = std::move(match->entry);
  if (hit.reuse < at_least) return hit;
  try {
    hit.payload = read_snapshot_payload(hit.entry.path, *hit.entry.header, &hit.times);
  } catch (const Error& e) {
    if (!store_entry_damaged(e)) throw;
    on_damaged(hit.entry.path, e.value());
    return std::nullopt;
  }
  return hit;
}

void restore_cut(Context& ctx, std::span<const uint8_t> state, size_t have, size_t keep,
                 const std::string& path) {
  restore_prefix(ctx, state, have, path);
  if (keep < have) ctx.seq_rm(0, static_cast<Pos>(keep), -1);
}

namespace {

// How a check names the state it refuses.
std::string state_name(const std::string& path) {
  return path.empty() ? "the prefix state" : fmt::format("snapshot '{}'", path);
}

}  // namespace

void check_restored_prefix(const Context& ctx, size_t n_tokens, const std::string& path) {
  const Pos lo = ctx.seq_pos_min(0);
  const Pos hi = ctx.seq_pos_max(0);
  // A sliding-window model's cache may have let the oldest cells go.
  const bool window = ctx.kv_layout().n_swa > 0;
  if ((lo == 0 || (window && lo > 0 && lo <= hi)) && hi >= 0 &&
      static_cast<size_t>(hi) + 1 == n_tokens) {
    return;
  }
  throw Error(ErrorCode::kCorruption,
              fmt::format("{}: after its restore sequence 0 holds {}, where its {} tokens are at "
                          "0..{}",
                          state_name(path),
                          hi < 0 ? std::string("nothing") : fmt::format("positions {}..{}", lo, hi),
                          n_tokens, static_cast<int64_t>(n_tokens) - 1));
}

void check_prefix_cells(const Context& ctx, std::span<const uint8_t> state, size_t n_tokens,
                        const std::string& path) {
  size_t n_cells = 0;
  std::string astray;  // the first cell not where a prefill puts it
  const auto cell = [&](Pos pos, std::span<const SeqId> seqs) {
    const bool in_place = std::cmp_equal(pos, n_cells) && seqs.size() == 1 && seqs[0] == 0;
    if (!in_place && astray.empty()) {
      astray = fmt::format(
          "its KV cell {} holds position {} of sequences [{}], where a prefill "
          "puts position {} of sequence 0 alone",
          n_cells, pos, fmt::join(seqs, ", "), n_cells);
    }
    ++n_cells;
  };
  std::string what;
  try {
    if (const uint32_t n_streams = ctx.read_state_cells(state, cell); n_streams != 1) {
      what = fmt::format("its state has {} KV streams, where a prefill context's has 1", n_streams);
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorruption) throw;
    what = e.message();
  }
  if (what.empty() && n_cells != n_tokens) {
    what = fmt::format(
        "its state holds {} KV cells, where its {} tokens need {} (positions 0..{} "
        "of sequence 0)",
        n_cells, n_tokens, n_tokens, static_cast<int64_t>(n_tokens) - 1);
  }
  if (what.empty()) what = std::move(astray);
  if (!what.empty())
    throw Error(ErrorCode::kCorruption, fmt::format("{}: {}", state_name(path), what));
}

void restore_prefix(Context& ctx, std::span<const uint8_t> state, size_t n_tokens,
                    const std::string& path) {
  check_prefix_cells(ctx, state, n_tokens, path);
  ctx.state_set(state);
  check_restored_prefix(ctx, n_tokens, path);
}

}  // namespace swarmkv::detail
