#include "snapshot_cmd.h"

#include "progress.h"
#include "terminal_text.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarmkv/log.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"
#include "swarmkv/snapshot.h"

namespace swarmkv::cli {
namespace {

namespace fs = std::filesystem;

bool is_pipeline_file(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  return ext == ".yaml" || ext == ".yml" || ext == ".json";
}

// The store the commands read; a path that cannot be a directory is an
// error here (an empty listing would hide it), while a missing one is an
// empty store.
SnapshotStore store_at(const std::string& dir) {
  SnapshotStore store = dir.empty() ? SnapshotStore::open_default() : SnapshotStore(dir);
  std::error_code ec;
  const auto status = std::filesystem::status(store.dir(), ec);
  if ((ec && ec != std::errc::no_such_file_or_directory) ||
      (std::filesystem::exists(status) && !std::filesystem::is_directory(status))) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("snapshot store '{}' is not a directory{}", store.dir(),
                            ec ? " (" + ec.message() + ")" : std::string()));
  }
  return store;
}

// A file path, a store key, or a unique prefix (at least 6 digits) of one.
std::string resolve_target(const SnapshotStore& store, const std::string& target) {
  std::error_code ec;
  if (fs::is_regular_file(target, ec)) return target;
  const bool hex = target.size() >= 6 && target.size() <= 32 &&
                   std::all_of(target.begin(), target.end(),
                               [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
  if (hex) {
    std::vector<std::string> found;
    for (const fs::directory_entry& d : fs::directory_iterator(store.dir(), ec)) {
      const std::string name = d.path().filename().string();
      if (name.starts_with(target) && d.path().extension() == ".swkv") {
        found.push_back(d.path().string());
      }
    }
    if (found.size() == 1) return found[0];
    if (found.size() > 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("'{}' matches {} snapshots in {}; give more digits", target,
                              found.size(), store.dir()));
    }
  }
  throw Error(ErrorCode::kNotFound,
              fmt::format("no snapshot file or store key '{}' (store: {})", target, store.dir()));
}

std::string iso_time(int64_t unix) {
  const std::time_t t = static_cast<std::time_t>(unix);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json header_json(const SnapshotHeader& h, const std::string& path) {
  nlohmann::json sections = nlohmann::json::array();
  for (const SnapshotSection& s : h.sections) {
    sections.push_back({{"name", s.name},
                        {"offset", s.offset},
                        {"size", s.size},
                        {"xxh3", fmt::format("{:016x}", s.xxh3)}});
  }
  return {{"path", path},
          {"key", snapshot_key(h.meta.binding, h.meta.tokens)},
          {"format_version", h.meta.format_version},
          {"engine", h.meta.binding.engine},
          {"state_version", h.meta.binding.state_version},
          {"model_sha256", h.meta.binding.model_sha256},
          {"model_file", h.meta.model_file},
          {"layout", kv_layout_json(h.meta.binding.layout)},
          {"n_tokens", h.meta.tokens.size()},
          {"payload_bytes", h.meta.payload_bytes},
          {"file_bytes", h.file_bytes},
          {"created", iso_time(h.meta.created_unix)},
          {"producer", h.meta.producer},
          {"sections", sections}};
}

// Text from a snapshot's metadata as a terminal may show it, on one line:
// a file cannot move the cursor, retitle the window or clear the screen.
std::string printable(std::string_view text) {
  return terminal_safe(text, /*keep_lines=*/false);
}

}  // namespace

SnapshotCommands::SnapshotCommands(CLI::App& app) {
  prefill_ = app.add_subcommand(
      "prefill",
      "Prefill a document once and keep its KV state as a snapshot, without running agents: in "
      "the snapshot store (so the next `swarmkv run` of a pipeline over the same document, "
      "model and n_batch restores it instead of prefilling), and in --out FILE when given. "
      "INPUT is a pipeline file (.yaml/.yml/.json: its document, system prompt, model and "
      "n_batch) or a plain document, which gets the default system prompt and the model's chat "
      "template, exactly as a pipeline without `system:` would.");
  prefill_->add_option("input", input_, "pipeline file or document")
      ->required()
      ->check(CLI::ExistingFile);
  prefill_->add_option("-o,--out", out_, "also write the snapshot to this file");
  prefill_->add_option("-m,--model", model_, "GGUF model; overrides the pipeline's 'model'");
  prefill_->add_option("--system", system_, "system prompt for a plain document")
      ->each([this](const std::string&) { system_given_ = true; });
  prefill_->add_option("-t,--threads", threads_,
                       "CPU threads (0 = all cores, at most the hardware threads)");
  // n_ubatch, flash attention and the KV type are part of the snapshot's
  // binding (its KV layout): they must match the runs that reuse it.
  engine_.add_to(prefill_);
  prefill_
      ->add_option("--snapshot-cache", cache_mode_,
                   "on: look the store up, publish on a miss; read-only; off: neither")
      ->check(CLI::IsMember({"on", "off", "read-only"}))
      ->capture_default_str();
  prefill_->add_option("--cache-dir", dir_, "snapshot store (default <cache>/snapshots)");
  prefill_->add_flag("--json", json_, "print one JSON object");

  snapshot_ = app.add_subcommand(
      "snapshot",
      "Inspect and manage the snapshot store (default <cache>/snapshots, where <cache> is "
      "$SWARMKV_CACHE or ~/.cache/swarmkv; cap $SWARMKV_SNAPSHOT_CACHE_MAX, default 4G, least "
      "recently used evicted first). A TARGET is a snapshot file, a store key or a unique key "
      "prefix of at least 6 digits. Clear the whole store with `swarmkv snapshot rm --all`.");
  snapshot_->require_subcommand(1);
  snapshot_->fallthrough();  // --cache-dir after the subcommand too
  snapshot_->add_option("--cache-dir", dir_, "snapshot store (default <cache>/snapshots)");
  ls_ = snapshot_->add_subcommand("ls", "List the store's snapshots, most recently used first");
  ls_->add_flag("--json", json_, "print a JSON array");
  info_ = snapshot_->add_subcommand("info", "Print a snapshot's header: binding, tokens, sections");
  info_->add_option("target", targets_, "snapshot file or key")->required();
  info_->add_flag("--json", json_, "print JSON");
  verify_ = snapshot_->add_subcommand(
      "verify", "Read every section and check every checksum; exit status 1 if any fails");
  verify_->add_option("target", targets_, "snapshot files or keys")->required();
  verify_->add_flag("--json", json_, "print a JSON array with the read and verify times");
  rm_ = snapshot_->add_subcommand("rm", "Remove snapshots from the store");
  rm_->add_option("target", targets_,
                  "store keys (removed however damaged) or snapshot files (a file without the "
                  "snapshot magic is refused); all are checked before any is removed");
  rm_->add_flag("--all", all_, "remove every snapshot in the store");
  gc_ = snapshot_->add_subcommand(
      "gc", "Evict least recently used snapshots above the cap and remove stale temporary files");
  gc_->add_option("--max", max_, "cap for this collection, e.g. 2G (default: the store's cap)");
}

std::optional<int> SnapshotCommands::run() {
  if (*prefill_) return run_prefill();
  if (*ls_) return run_ls();
  if (*info_) return run_info();
  if (*verify_) return run_verify();
  if (*rm_) return run_rm();
  if (*gc_) return run_gc();
  return std::nullopt;
}

int SnapshotCommands::run_prefill() {
  PipelineSpec spec;
  if (is_pipeline_file(input_)) {
    spec = load_pipeline_file(input_);
    if (system_given_) {
      throw Error(ErrorCode::kInvalidArgument,
                  "--system is for a plain document; a pipeline file has its own 'system'");
    }
  } else {
    spec.document = read_file(input_, "document file");
    spec.document_source = "file:" + input_;
    if (system_given_) spec.system_prompt = system_;
  }
  if (!model_.empty()) spec.model = model_;
  if (threads_) spec.n_threads = *threads_;
  engine_.apply(spec);
  spec.validate();
  require_text(spec.document, "the document");
  require_text(spec.system_prompt, "the system prompt");
  RunOptions options;
  options.snapshot.cache = parse_snapshot_cache_mode(cache_mode_);
  options.snapshot.cache_dir = dir_;
  if (options.snapshot.cache == SnapshotCacheMode::kOff && out_.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "--snapshot-cache off without --out would keep the snapshot nowhere");
  }
  options.on_prefill_progress = prefill_progress();
  const std::string model_path = resolve_model_path(spec.model);
  auto model = Model::load(model_path, spec.model_options());
  const PrefillReport r = prefill_document(spec, model, options, out_);
  if (json_) {
    nlohmann::json out = {
        {"model", model_path},
        {"prefix_tokens", r.prefix_tokens},
        {"prefill_ms", r.prefill_ms},
        {"export_ms", r.export_ms},
        {"write_ms", r.write_ms},
        {"out", r.out_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.out_path)},
        {"snapshot", snapshot_json(r.snapshot)}};
    std::cout << swarmkv::dump_json(out) << "\n";
  } else {
    const SnapshotUse& s = r.snapshot;
    std::cout << fmt::format("prefix {} tokens: {} reused ({}), {} prefilled in {:.1f} ms\n",
                             r.prefix_tokens, s.reused_tokens, to_string(s.source),
                             s.prefilled_tokens, r.prefill_ms);
    std::cout << fmt::format("key {} | {:.1f} MiB of KV state\n", s.key,
                             static_cast<double>(s.bytes) / 1048576.0);
    if (s.published) std::cout << "published to the store: " << s.path << "\n";
    if (!r.out_path.empty()) {
      std::cout << fmt::format("written to {} in {:.1f} ms\n", r.out_path, r.write_ms);
    }
  }
  return 0;
}

int SnapshotCommands::run_ls() {
  const SnapshotStore store = store_at(dir_);
  const std::vector<SnapshotStore::Entry> entries = store.list();
  uint64_t total = 0;
  nlohmann::json out = nlohmann::json::array();
  if (!json_) {
    std::cout << fmt::format("{:<32} {:>7} {:>10} {:<20} {:<20} {}\n", "key", "tokens", "MiB",
                             "last used", "model", "status");
  }
  for (const SnapshotStore::Entry& e : entries) {
    total += e.bytes;
    if (json_) {
      nlohmann::json j = {{"key", e.key},
                          {"path", e.path},
                          {"bytes", e.bytes},
                          {"last_used", iso_time(e.last_used_unix)},
                          {"error", error_json(e.error)}};
      if (e.header) {
        j["n_tokens"] = e.header->meta.tokens.size();
        j["model_file"] = e.header->meta.model_file;
        j["model_sha256"] = e.header->meta.binding.model_sha256;
        j["created"] = iso_time(e.header->meta.created_unix);
      }
      out.push_back(j);
    } else {
      std::cout << fmt::format("{:<32} {:>7} {:>10.1f} {:<20} {:<20} {}\n", e.key,
                               e.header ? std::to_string(e.header->meta.tokens.size()) : "?",
                               static_cast<double>(e.bytes) / 1048576.0, iso_time(e.last_used_unix),
                               e.header ? printable(e.header->meta.model_file).substr(0, 20) : "?",
                               e.error ? e.error->to_string() : "ok");
    }
  }
  if (json_) {
    std::cout << swarmkv::dump_json(out) << "\n";
  } else {
    std::cout << fmt::format("{} snapshot(s), {:.1f} MiB of a {:.1f} MiB cap, in {}\n",
                             entries.size(), static_cast<double>(total) / 1048576.0,
                             static_cast<double>(store.max_bytes()) / 1048576.0, store.dir());
  }
  return 0;
}

int SnapshotCommands::run_info() {
  const SnapshotStore store = store_at(dir_);
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& t : targets_) {
    const std::string path = resolve_target(store, t);
    out.push_back(header_json(read_snapshot_header(path), path));
  }
  if (json_ || out.size() != 1) {
    std::cout << swarmkv::dump_json(out.size() == 1 ? out[0] : out) << "\n";
  } else {
    const nlohmann::json& j = out[0];
    std::cout << fmt::format(
        "{}\n  key {}\n  model {} (sha256 {})\n  engine {} (state format {})\n  layout {}\n  "
        "{} tokens, {} payload bytes in {} sections, {} bytes on disk\n  created {} by {}\n",
        printable(j["path"].get<std::string>()), j["key"].get<std::string>(),
        printable(j["model_file"].get<std::string>()),
        printable(j["model_sha256"].get<std::string>()), printable(j["engine"].get<std::string>()),
        j["state_version"].get<uint32_t>(), j["layout"].dump(), j["n_tokens"].get<size_t>(),
        j["payload_bytes"].get<uint64_t>(), j["sections"].size(), j["file_bytes"].get<uint64_t>(),
        j["created"].get<std::string>(), printable(j["producer"].get<std::string>()));
  }
  return 0;
}

int SnapshotCommands::run_verify() {
  const SnapshotStore store = store_at(dir_);
  nlohmann::json out = nlohmann::json::array();
  int failed = 0;
  for (const std::string& t : targets_) {
    std::string path = t;
    nlohmann::json j = {{"target", t}};
    try {
      path = resolve_target(store, t);
      const Stopwatch all;
      const SnapshotHeader h = read_snapshot_header(path);
      SnapshotReadTimes times;
      const std::vector<uint8_t> payload = read_snapshot_payload(path, h, &times);
      const double ms = all.ms();
      j.update({{"path", path},
                {"ok", true},
                {"error", nullptr},
                {"bytes", h.file_bytes},
                {"total_ms", ms},
                {"read_ms", times.read_ms},
                {"verify_ms", times.verify_ms},
                {"mb_per_s", static_cast<double>(h.file_bytes) / 1e3 / ms}});
      if (!json_) {
        std::cout << fmt::format("{}: ok ({} sections, {:.1f} MiB in {:.1f} ms)\n", path,
                                 h.sections.size(), static_cast<double>(h.file_bytes) / 1048576.0,
                                 ms);
      }
    } catch (const Error& e) {
      ++failed;
      j.update({{"path", path}, {"ok", false}, {"error", error_json(e.value())}});
      std::cerr << fmt::format("swarmkv: error: {}: {}\n", path, e.what());
    }
    out.push_back(j);
  }
  if (json_) std::cout << swarmkv::dump_json(out) << "\n";
  return failed == 0 ? 0 : 1;
}

int SnapshotCommands::run_rm() {
  const SnapshotStore store = store_at(dir_);
  if (all_ == !targets_.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "give snapshot keys or files to remove, or --all");
  }
  std::vector<std::string> paths;
  if (all_) {
    for (const SnapshotStore::Entry& e : store.list()) paths.push_back(e.path);
  } else {
    // Every target is checked before any is removed. A key names a store
    // entry, removed however damaged; a path must be a snapshot file.
    for (const std::string& t : targets_) {
      std::error_code ec;
      if (fs::is_regular_file(t, ec) && !has_snapshot_magic(t)) {
        throw Error(ErrorCode::kCorruption,
                    fmt::format("snapshot '{}': not a SwarmKV snapshot (no SWKVSNAP magic); "
                                "nothing removed",
                                t));
      }
      paths.push_back(resolve_target(store, t));
    }
  }
  for (const std::string& p : paths) {
    if (store.remove_path(p)) std::cout << "removed " << p << "\n";
  }
  return 0;
}

int SnapshotCommands::run_gc() {
  const SnapshotStore store = store_at(dir_);
  const uint64_t cap = max_.empty() ? store.max_bytes() : parse_byte_size(max_);
  const SnapshotStore::GcReport r = store.gc(cap);
  std::cout << fmt::format(
      "removed {} snapshot(s) and {} stale temporary file(s), freed {:.1f} MiB; {:.1f} MiB kept "
      "(cap {:.1f} MiB)\n",
      r.entries_removed, r.temporaries_removed, static_cast<double>(r.bytes_freed) / 1048576.0,
      static_cast<double>(r.bytes_kept) / 1048576.0, static_cast<double>(cap) / 1048576.0);
  return 0;
}

}  // namespace swarmkv::cli
