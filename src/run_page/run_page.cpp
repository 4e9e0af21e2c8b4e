// run_page_html: the graph (columns by the DAG's depth), the timeline and
// the agents' texts of one result, as static HTML and SVG. The result is
// read through the codec (result_from_json), never key by key here.
#include "swarmkv/run_page.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"

namespace swarmkv {
namespace {

using nlohmann::json;

// Text as HTML (element content and attribute values alike).
std::string esc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// At most `n` characters of a name, "…" marking a cut (never inside a
// UTF-8 character).
std::string shorten(const std::string& text, size_t n) {
  if (text.size() <= n) return text;
  size_t cut = n - 1;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "\xe2\x80\xa6";
}

std::string ms_text(double ms) {
  if (ms >= 10000) return fmt::format("{:.1f} s", ms / 1000);
  if (ms >= 1000) return fmt::format("{:.2f} s", ms / 1000);
  return fmt::format("{:.0f} ms", ms);
}

// How an agent is drawn: its outcome, or where it stands in a run going on.
enum class Look { kOk, kFailed, kSkipped, kWaiting, kRunning };

Look look_of(const AgentResult& a, AgentPhase phase) {
  if (phase == AgentPhase::kWaiting) return Look::kWaiting;
  if (phase == AgentPhase::kRunning) return Look::kRunning;
  if (a.status == NodeStatus::kOk) return Look::kOk;
  return a.status == NodeStatus::kFailed ? Look::kFailed : Look::kSkipped;
}

// The result's parts the page shows, in its words.
struct Agent {
  std::string name, answer, prompt, error, fork_from, needs, worker;
  // A structured answer's fields (an object's keys in generation order, an
  // array's [i]), each value as text: a string as it is, the rest as JSON.
  std::vector<std::pair<std::string, std::string>> fields;
  Look look = Look::kOk;
  std::vector<std::string> depends_on;
  double wait = 0, started = 0, first_token = 0, done = 0;
  std::vector<double> token_at;
  size_t n_tokens = 0;
  int depth = 1;
};

std::vector<std::pair<std::string, std::string>> fields_of(const std::string& answer) {
  const auto value = nlohmann::ordered_json::parse(answer, nullptr, /*allow_exceptions=*/false);
  std::vector<std::pair<std::string, std::string>> out;
  const auto text = [](const nlohmann::ordered_json& v) {
    return v.is_string() ? v.get<std::string>() : v.dump();
  };
  if (value.is_object()) {
    for (const auto& [key, v] : value.items()) out.emplace_back(key, text(v));
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i)
      out.emplace_back(fmt::format("[{}]", i), text(value[i]));
  }
  return out;
}

std::vector<Agent> page_agents(const ResultRead& read) {
  const std::vector<AgentResult>& results = read.result.agents;
  const std::vector<int> depths = agent_depths(results);
  std::vector<Agent> out;
  for (size_t i = 0; i < results.size(); ++i) {
    const AgentResult& r = results[i];
    Agent& x = out.emplace_back();
    x.name = r.name;
    x.look = look_of(r, read.live ? read.live->agents.at(i) : AgentPhase::kDone);
    x.answer = r.answer;
    if (r.answer_is_json) x.fields = fields_of(r.answer);
    x.prompt = r.prompt_rendered;
    if (r.error) x.error = fmt::format("{}: {}", to_string(r.error->code), r.error->message);
    x.fork_from = r.fork_from;
    x.depends_on = r.depends_on;
    if (r.needs.tokens > 0) {
      x.needs = fmt::format("the first {} tokens", r.needs.tokens);
    } else if (!r.needs.until.empty()) {
      x.needs = fmt::format("up to \"{}\"", r.needs.until);
    }
    x.worker = r.worker;
    x.wait = r.timings_ms.wait;
    x.started = r.timings_ms.started_at;
    x.first_token = r.timings_ms.first_token_at;
    x.done = r.timings_ms.done_at;
    x.token_at = r.token_at_ms;
    x.n_tokens = r.tokens.size();
    x.depth = depths[i];
  }
  return out;
}

// A run still going on (a served page) has agents waiting and running.
std::string status_text(const Agent& a) {
  switch (a.look) {
    case Look::kOk:
      return "ok";
    case Look::kSkipped:
      return "not run: a dependency failed";
    case Look::kWaiting:
      return "waiting";
    case Look::kRunning:
      return "running";
    case Look::kFailed:
      break;
  }
  return "FAILED";
}

// The CSS class of its node and its article.
std::string_view status_class(const Agent& a) {
  switch (a.look) {
    case Look::kOk:
      return "ok";
    case Look::kFailed:
      return "failed";
    case Look::kWaiting:
      return "waiting";
    case Look::kRunning:
      return "running";
    case Look::kSkipped:
      break;
  }
  return "skipped";
}

constexpr int kNodeW = 200, kNodeH = 46, kColW = 250, kRowH = 58, kPad = 16, kTopPad = 34;

// The agents' graph: the document, then a column per depth; edges by kind.
class Graph {
 public:
  explicit Graph(const std::vector<Agent>& agents) : agents_(agents), at_(agents.size()) {
    for (size_t i = 0; i < agents_.size(); ++i) index_.emplace(agents_[i].name, i);
    place();
    for (size_t i = 0; i < agents_.size(); ++i) {
      draw_edges(i);
      draw_node(i);
    }
  }

  std::string svg() const {
    return fmt::format(
        "<svg class=\"graph\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" role=\"img\" "
        "aria-label=\"The agents' graph\">\n"
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"9\" "
        "markerHeight=\"9\" markerUnits=\"userSpaceOnUse\" orient=\"auto\"><path d=\"M0 0 L10 5 L0 "
        "10 z\"/>"
        "</marker></defs>\n{2}"
        "<g class=\"node doc\"><title>The document: every agent's context starts with it</title>"
        "<rect x=\"{3}\" y=\"{4}\" width=\"{5}\" height=\"{6}\" rx=\"6\"/>"
        "<text x=\"{7}\" y=\"{8}\" class=\"name\">document</text>"
        "<text x=\"{7}\" y=\"{9}\" class=\"sub\">the shared prefix</text></g>\n{10}{11}</svg>",
        width_, std::max(height_, kTopPad + kPad + kRowH), edges_, kDoc.first, kDoc.second, kNodeW,
        kNodeH, kDoc.first + 8, kDoc.second + 19, kDoc.second + 37, nodes_, labels_);
  }

 private:
  using Point = std::pair<int, int>;  // x, y of a node's top left
  static constexpr Point kDoc{kPad, kTopPad};

  // Each node's place: its depth's column, the next free row in it.
  void place() {
    int max_depth = 0;
    for (const Agent& a : agents_) max_depth = std::max(max_depth, a.depth);
    std::vector<int> rows(static_cast<size_t>(max_depth) + 1, 0);
    for (size_t i = 0; i < agents_.size(); ++i) {
      const int d = agents_[i].depth;
      at_[i] = {kPad + d * kColW, kTopPad + rows[static_cast<size_t>(d)]++ * kRowH};
    }
    int tallest = 1;
    for (const int r : rows) tallest = std::max(tallest, r);
    width_ = kPad * 2 + max_depth * kColW + kNodeW;
    height_ = kTopPad + kPad + tallest * kRowH;
  }

  void edge(Point from, Point to, const char* cls, const std::string& what) {
    const int x1 = from.first + kNodeW, y1 = from.second + kNodeH / 2;
    const int x2 = to.first - 2, y2 = to.second + kNodeH / 2;
    std::string d;
    if (to.first - from.first > kColW) {
      // Past the columns between: up into the gap above the rows, along it,
      // and down into the target, so that it crosses no node.
      const int lane = std::min(from.second, to.second) - (kRowH - kNodeH) / 2;
      d = fmt::format("M{} {} C{} {} {} {} {} {} L{} {} C{} {} {} {} {} {}", x1, y1, x1 + 20, y1,
                      x1 + 10, lane, x1 + 30, lane, x2 - 30, lane, x2 - 10, lane, x2 - 20, y2, x2,
                      y2);
    } else {
      const int mid = (x1 + x2) / 2;
      d = fmt::format("M{} {} C{} {} {} {} {} {}", x1, y1, mid, y1, mid, y2, x2, y2);
    }
    edges_ += fmt::format(
        "<path class=\"edge {}\" d=\"{}\" marker-end=\"url(#arrow)\"><title>{}</title></path>\n",
        cls, d, esc(what));
  }

  // Agent i's edges: from what it waits on and continues, else from the document.
  void draw_edges(size_t i) {
    const Agent& a = agents_[i];
    bool from_doc = true;
    for (const std::string& d : a.depends_on) {
      if (const auto it = index_.find(d); it != index_.end()) {
        edge(at_[it->second], at_[i], "depends", fmt::format("{} waits for {}", a.name, d));
        from_doc = false;
      }
    }
    if (const auto it = index_.find(a.fork_from); !a.fork_from.empty() && it != index_.end()) {
      edge(at_[it->second], at_[i], "fork",
           fmt::format("{} continues {}'s conversation (fork_from)", a.name, a.fork_from));
      from_doc = false;
    }
    if (!from_doc) return;
    edge(kDoc, at_[i], a.needs.empty() ? "doc" : "needs",
         a.needs.empty() ? fmt::format("{} forks from the document", a.name)
                         : fmt::format("{} needs {} of the document", a.name, a.needs));
    if (!a.needs.empty()) {
      labels_ += fmt::format("<text class=\"needs-label\" x=\"{}\" y=\"{}\">needs {}</text>\n",
                             at_[i].first, at_[i].second - 3, esc(shorten(a.needs, 34)));
    }
  }

  void draw_node(size_t i) {
    const Agent& a = agents_[i];
    const Point p = at_[i];
    const std::string sub =
        a.look == Look::kOk ? fmt::format("ok, {} tokens, done {}", a.n_tokens, ms_text(a.done))
        : a.look == Look::kRunning ? fmt::format("running, {} tokens", a.n_tokens)
                                   : shorten(status_text(a), 30);
    nodes_ += fmt::format(
        "<a href=\"#agent-{0}\" id=\"node-{0}\"><g class=\"node {1}\">"
        "<title>{2}: {3}</title>"
        "<rect x=\"{4}\" y=\"{5}\" width=\"{6}\" height=\"{7}\" rx=\"6\"/>"
        "<text x=\"{8}\" y=\"{9}\" class=\"name\">{10}</text>"
        "<text x=\"{8}\" y=\"{11}\" class=\"sub\">{12}</text></g></a>\n",
        i, status_class(a), esc(a.name), esc(status_text(a)), p.first, p.second, kNodeW, kNodeH,
        p.first + 8, p.second + 19, esc(shorten(a.name, 26)), p.second + 37, esc(sub));
  }

  const std::vector<Agent>& agents_;
  std::vector<Point> at_;
  std::map<std::string, size_t> index_;  // a name's first agent
  int width_ = 0, height_ = 0;
  std::string edges_, nodes_, labels_;
};

// A step of 1, 2 or 5 times a power of ten giving about `ticks` ticks.
double tick_step(double span, int ticks) {
  const double raw = span / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

// The timeline: an axis in ms, the document's bar, then one row per agent.
class Timeline {
 public:
  Timeline(const PipelineResult& result, const std::vector<Agent>& agents)
      : result_(result), agents_(agents) {
    t_max_ = std::max(result.total_ms, result.prefill_done_at_ms);
    for (const Agent& a : agents) t_max_ = std::max(t_max_, a.done);
    if (t_max_ <= 0) t_max_ = 1;
  }

  std::string svg() const {
    const int height = kTop + kLine * static_cast<int>(agents_.size() + 1) + 10;
    std::string out = fmt::format(
        "<svg class=\"timeline\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
        "role=\"img\" aria-label=\"Timeline of the run\">\n"
        "<defs><pattern id=\"queued\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
        "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" class=\"queued-bg\"/>"
        "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" class=\"queued-line\"/></pattern></defs>\n",
        kLabelW + kPlotW + 20, height);
    const double step = tick_step(t_max_, 8);
    for (double t = 0; t <= t_max_ + 1e-9; t += step) {
      out += fmt::format(
          "<line class=\"tick\" x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>"
          "<text class=\"axis\" x=\"{0:.1f}\" y=\"{3}\">{4}</text>\n",
          x(t), kTop - 8, height - 6, kTop - 12, esc(ms_text(t)));
    }
    out += document_row(kTop);
    for (size_t i = 0; i < agents_.size(); ++i) {
      out += fmt::format("<a href=\"#agent-{0}\" id=\"bar-{0}\"><g>{1}</g></a>\n", i,
                         agent_row(agents_[i], kTop + kLine * static_cast<int>(i + 1)));
    }
    return out + "</svg>";
  }

 private:
  static constexpr int kLabelW = 190, kPlotW = 900, kBarH = 14, kLine = 22, kTop = 30;

  double x(double t) const { return kLabelW + std::clamp(t, 0.0, t_max_) / t_max_ * kPlotW; }

  // The document: its prefill, or the restore of its snapshot.
  std::string document_row(int y) const {
    const std::optional<SnapshotUse>& snapshot = result_.snapshot;
    const bool prefilled = !snapshot || snapshot->source == SnapshotSource::kPrefill;
    const double prefill_done = result_.prefill_done_at_ms;
    std::string out, doc_text = "per agent (fork none)";
    if (prefill_done > 0) {
      const double took = prefilled ? result_.prefill_ms : snapshot->load_ms + result_.restore_ms;
      const double from = std::max(0.0, prefill_done - took);
      doc_text = prefilled ? fmt::format("prefill, {} tokens", result_.prefix_tokens)
                           : fmt::format("restored from {} ({} tokens)",
                                         to_string(snapshot->source), snapshot->reused_tokens);
      out += fmt::format(
          "<g id=\"bar-document\"><title>document: {0}, ready at {1}</title>"
          "<rect class=\"doc-bar\" x=\"{2:.1f}\" y=\"{3}\" width=\"{4:.1f}\" "
          "height=\"{5}\"/></g>\n",
          esc(doc_text), esc(ms_text(prefill_done)), x(from), y,
          std::max(1.0, x(prefill_done) - x(from)), kBarH);
    }
    return out + fmt::format("<text class=\"label\" x=\"4\" y=\"{}\">document: {}</text>\n", y + 11,
                             esc(shorten(doc_text, 28)));
  }

  // An agent's label and bars: queued, started to first token, generating,
  // a tick per token; a note unless it is ok.
  std::string agent_row(const Agent& a, int y) const {
    std::string row = fmt::format("<text class=\"label\" x=\"4\" y=\"{}\">{}</text>", y + 11,
                                  esc(shorten(a.name, 26)));
    if (a.done <= 0 && a.started <= 0) {
      return row + fmt::format("<text class=\"note\" x=\"{}\" y=\"{}\">{}</text>", x(0) + 4, y + 11,
                               esc(status_text(a)));
    }
    const double queued = std::max(0.0, a.started - a.wait);
    const double first = a.first_token > 0 ? a.first_token : a.done;
    row += fmt::format(
        "<title>{0}: {1}; queued {2}, started {3}, first token {4}, done {5}, {6} "
        "tokens</title>",
        esc(a.name), esc(status_text(a)), esc(ms_text(queued)), esc(ms_text(a.started)),
        esc(ms_text(a.first_token)), esc(ms_text(a.done)), a.n_tokens);
    if (a.started > queued) {
      row += fmt::format(
          "<rect class=\"queued\" x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\"/>",
          x(queued), y, x(a.started) - x(queued), kBarH);
    }
    const std::string_view failed =
        a.look == Look::kOk || a.look == Look::kRunning ? "" : " failed";
    row += fmt::format(
        "<rect class=\"prompt{}\" x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\"/>", failed,
        x(a.started), y, std::max(1.0, x(first) - x(a.started)), kBarH);
    if (a.done > first) {
      row += fmt::format(
          "<rect class=\"generate{}\" x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\"/>",
          failed, x(first), y, x(a.done) - x(first), kBarH);
    }
    for (const double t : a.token_at) {
      row += fmt::format(
          "<line class=\"token\" x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" "
          "y2=\"{2}\"/>",
          x(t), y + kBarH, y + kBarH + 3);
    }
    if (a.look != Look::kOk) {
      row += fmt::format("<text class=\"note\" x=\"{:.1f}\" y=\"{}\">{}</text>", x(a.done) + 4,
                         y + 11, esc(status_text(a)));
    }
    return row;
  }

  const PipelineResult& result_;
  const std::vector<Agent>& agents_;
  double t_max_ = 1;
};

// A served run's state (live_result_json's "live"): what it does now.
std::string live_text(const RunProgress& live, size_t agents, size_t done, int refresh_s) {
  std::string text;
  switch (live.state) {
    case RunState::kQueued:
      text = "queued: waiting for a free pipeline worker";
      break;
    case RunState::kRunning:
      text = live.prefill_done < live.prefill_total
                 ? fmt::format("running: the document's prefill, {} of {} tokens",
                               live.prefill_done, live.prefill_total)
                 : fmt::format("running: {} of {} agents done", done, agents);
      break;
    case RunState::kOk:
      text = "done";
      break;
    case RunState::kFailed:
      text = live.error ? fmt::format("could not run: {}: {}", to_string(live.error->code),
                                      live.error->message)
                        : std::string(to_string(live.state));
      break;
  }
  if (refresh_s > 0)
    text += fmt::format(" (this page reloads every {} s until the run ends)", refresh_s);
  return text;
}

// The header's rows: what ran, where the document's KV came from, counts and times.
class Header {
 public:
  Header(const ResultRead& read, const std::vector<Agent>& agents)
      : read_(read), r_(read.result), agents_(agents) {}

  std::string html(const std::string& source, int refresh_s) {
    const auto count = [&](Look look) {
      return static_cast<size_t>(std::count_if(agents_.begin(), agents_.end(),
                                               [look](const Agent& a) { return a.look == look; }));
    };
    const size_t ok = count(Look::kOk), failed = count(Look::kFailed),
                 skipped = count(Look::kSkipped), waiting = count(Look::kWaiting),
                 running = count(Look::kRunning);
    if (read_.live) {
      rows_ += fmt::format(
          "<dt>state</dt><dd id=\"state\">{}</dd>\n",
          esc(live_text(*read_.live, agents_.size(), ok + failed + skipped, refresh_s)));
    }
    row("model", read_.has("model") ? r_.model : "(not in this result)");
    if (!source.empty()) row("result from", source);
    row("fork", read_.has("fork") ? std::string(to_string(r_.fork)) : "?");
    row("exact", r_.exact                        ? "yes (every answer equals a re-prefill's)"
                 : !r_.exact_unavailable.empty() ? "no: " + r_.exact_unavailable
                                                 : "no");
    engine_rows();
    std::string counts = fmt::format("{} ok, {} failed, {} not run", ok, failed, skipped);
    if (running + waiting > 0) counts += fmt::format(", {} running, {} waiting", running, waiting);
    row("agents", counts);
    row("total", ms_text(r_.total_ms) + " (model load excluded)");
    if (read_.has("latency")) {
      const LatencySummary l = latency_summary(r_);
      const auto pct = [](const Percentiles& p) {
        return fmt::format("p50 {} · p95 {} · p99 {}", ms_text(p.p50), ms_text(p.p95),
                           ms_text(p.p99));
      };
      row("time to first token", pct(l.ttft));
      row("completion", pct(l.completion));
    }
    return "<dl class=\"facts\">\n" + rows_ + "</dl>\n";
  }

 private:
  void row(const std::string& k, const std::string& v) {
    rows_ += fmt::format("<dt>{}</dt><dd>{}</dd>\n", esc(k), esc(v));
  }

  // The engine, the document's KV state and the document.
  void engine_rows() {
    if (read_.has("engine")) {
      const ContextOptions& e = r_.engine;
      row("engine", fmt::format("KV {}, flash attention {}, {} threads ({} batch), n_batch {}",
                                to_string(e.type_k), e.flash_attn ? "on" : "off", e.n_threads,
                                e.n_threads_batch, e.n_batch));
    }
    if (const std::optional<SnapshotUse>& s = r_.snapshot) {
      row("document's KV", fmt::format("{}: {} tokens reused, {} prefilled{}", to_string(s->source),
                                       s->reused_tokens, s->prefilled_tokens,
                                       s->path.empty() ? "" : " (" + s->path + ")"));
    }
    const bool ready = read_.has("prefill_done_at_ms") &&
                       !(read_.live && read_.live->prefill_done < read_.live->prefill_total);
    row("document", ready ? fmt::format("{} tokens, ready at {}", r_.prefix_tokens,
                                        ms_text(r_.prefill_done_at_ms))
                          : fmt::format("{} tokens, not ready yet", r_.prefix_tokens));
  }

  const ResultRead& read_;
  const PipelineResult& r_;
  const std::vector<Agent>& agents_;
  std::string rows_;
};

std::string agents_html(const std::vector<Agent>& agents) {
  std::string out;
  for (size_t i = 0; i < agents.size(); ++i) {
    const Agent& a = agents[i];
    std::string links;
    if (!a.depends_on.empty()) {
      std::string names;
      for (const std::string& d : a.depends_on) names += (names.empty() ? "" : ", ") + d;
      links += "waits for " + names + ". ";
    }
    if (!a.fork_from.empty()) links += "continues " + a.fork_from + "'s conversation. ";
    if (!a.needs.empty()) links += "needs " + a.needs + " of the document. ";
    if (!a.worker.empty()) links += "ran on worker " + a.worker + ". ";
    out += fmt::format(
        "<article id=\"agent-{0}\" class=\"agent {1}\">\n<h3>{2} <span class=\"status\">{3}"
        "</span></h3>\n<p class=\"meta\">{4}started {5}, first token {6}, done {7}, {8} tokens. "
        "<a href=\"#node-{0}\">graph</a> · <a href=\"#bar-{0}\">timeline</a></p>\n",
        i, status_class(a), esc(a.name), esc(status_text(a)), esc(links), esc(ms_text(a.started)),
        esc(ms_text(a.first_token)), esc(ms_text(a.done)), a.n_tokens);
    if (!a.error.empty()) out += fmt::format("<p class=\"error\">{}</p>\n", esc(a.error));
    out +=
        fmt::format("<details><summary>Prompt, as rendered</summary><pre>{}</pre></details>\n",
                    esc(a.prompt.empty() ? "(not rendered: the agent never started)" : a.prompt));
    if (a.fields.empty()) {
      out += fmt::format("<pre class=\"answer\">{}</pre>\n</article>\n", esc(a.answer));
      continue;
    }
    // A structured answer: its fields, then the JSON as it came.
    out += "<dl class=\"fields\">";
    for (const auto& [key, value] : a.fields) {
      out += fmt::format("<dt>{}</dt><dd>{}</dd>", esc(key), esc(value));
    }
    out += fmt::format(
        "</dl>\n<details><summary>As JSON</summary><pre class=\"answer\">{}</pre></details>\n"
        "</article>\n",
        esc(a.answer));
  }
  return out;
}

constexpr std::string_view kStyle = R"(
body{font-family:system-ui,sans-serif;margin:1.5em;color:#111;max-width:1200px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}
dl.facts dt{font-weight:600}dl.facts dd{margin:0}
dl.fields{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;background:#f6f6f6;padding:.5em}
dl.fields dt{font-weight:600;font-family:monospace}dl.fields dd{margin:0;white-space:pre-wrap}
.scroll{overflow-x:auto;border:1px solid #ccc;padding:4px}
svg text{font-size:12px;fill:#111}svg .sub{font-size:11px;fill:#333}
.node rect{fill:#fff;stroke:#222;stroke-width:1.5}
.node.doc rect{fill:#eef;stroke-width:2.5}
.node.failed rect{fill:#fde8e8;stroke:#a00;stroke-width:3;stroke-dasharray:2 2}
.node.skipped rect{fill:#eee;stroke:#777;stroke-dasharray:1 3}
.node.waiting rect{fill:#f8f8f8;stroke:#777;stroke-dasharray:6 3}
.node.running rect{fill:#eef6ff;stroke:#05c;stroke-width:3}
a:focus .node rect,a:hover .node rect{stroke:#05c;stroke-width:3}
.edge{fill:none;stroke:#222}.edge.doc{stroke:#999;stroke-width:1}
.edge.depends{stroke-width:1.6}.edge.fork{stroke-width:2.6;stroke-dasharray:8 4}
.edge.needs{stroke:#555;stroke-width:1.6;stroke-dasharray:2 3}
.needs-label{font-size:10px;fill:#333}
marker path{fill:#222}
.tick{stroke:#ddd}.axis{font-size:10px;fill:#555;text-anchor:middle}
.doc-bar{fill:#557}.queued{fill:url(#queued);stroke:#999}
.queued-bg{fill:#fff}.queued-line{stroke:#999;stroke-width:2}
.prompt{fill:#9bd}.generate{fill:#247}.token{stroke:#000}
.prompt.failed,.generate.failed{fill:#d66}
.note{font-size:11px;fill:#a00}.label{font-size:11px}
.legend span{display:inline-block;margin-right:1.4em}
.legend svg{vertical-align:middle}
article.agent{border-top:1px solid #ccc;padding:.3em 0}
article.agent h3{font-size:1em;margin:.4em 0}
.status{font-weight:400;margin-left:.5em}
article.failed .status,.error{color:#a00}
article.skipped .status{color:#555}
table.runs{border-collapse:collapse}table.runs td,table.runs th{border:1px solid #ccc;padding:.2em .6em;text-align:left}\ntable.corpus td,table.corpus th{vertical-align:top;white-space:pre-wrap;max-width:28em}\ntable.corpus tr.failed th,table.corpus td.error{color:#a00}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em;margin:.3em 0}
.meta{color:#333;margin:.2em 0}
)";

std::string legend(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string out = "<p class=\"legend\">";
  for (const auto& [svg, text] : items) out += "<span>" + svg + " " + esc(text) + "</span>";
  return out + "</p>\n";
}

// The page; what run_page_html wraps.
std::string draw(const json& result, const std::string& source, int refresh_s) {
  const ResultRead read = result_from_json(result);
  const std::vector<Agent> agents = page_agents(read);
  const std::string title = fmt::format(
      "{} — {} agents", read.has("pipeline") ? read.result.pipeline : "pipeline", agents.size());
  const auto line = [](const char* cls) {
    return fmt::format(
        "<svg width=\"40\" height=\"10\" aria-hidden=\"true\"><line class=\"edge {}\" x1=\"0\" "
        "y1=\"5\" x2=\"40\" y2=\"5\"/></svg>",
        cls);
  };
  const auto box = [](const char* cls) {
    return fmt::format(
        "<svg width=\"30\" height=\"12\" aria-hidden=\"true\"><rect class=\"{}\" x=\"0\" y=\"0\" "
        "width=\"30\" height=\"12\"/></svg>",
        cls);
  };
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<link rel=\"icon\" href=\"data:,\">\n"
      "{3}<title>{0}</title>\n<style>{1}</style>\n</head>\n<body>\n<h1>{0}</h1>\n{2}",
      esc(title), kStyle, Header(read, agents).html(source, refresh_s),
      refresh_s > 0 ? fmt::format("<meta http-equiv=\"refresh\" content=\"{}\">\n", refresh_s)
                    : std::string());
  html += "<h2 id=\"graph\">Graph</h2>\n";
  html += legend({{line("doc"), "from the document"},
                  {line("depends"), "depends_on (waits for)"},
                  {line("fork"), "fork_from (continues the conversation)"},
                  {line("needs"), "needs a part of the document (watermark)"}});
  html += "<div class=\"scroll\">" + Graph(agents).svg() + "</div>\n";
  html += "<h2 id=\"timeline\">Timeline</h2>\n";
  html += legend({{box("doc-bar"), "document prefill or restore"},
                  {box("queued"), "queued (ready, waiting)"},
                  {box("prompt"), "started → first token"},
                  {box("generate"), "generating → done"},
                  {box("prompt failed"), "failed"}});
  html += "<div class=\"scroll\">" + Timeline(read.result, agents).svg() + "</div>\n";
  html +=
      "<p>Ticks under a bar: each token's time. Times from the run's start (model load "
      "excluded).</p>\n<h2 id=\"agents\">Agents</h2>\n";
  html += agents_html(agents);
  return html + "</body>\n</html>\n";
}

// One document's row of the corpus table: a cell per agent (its answer,
// or its fields), or one cell with the document's error.
std::string corpus_row(const json& d, const std::vector<std::string>& columns) {
  const std::string name = d.at("name").get<std::string>();
  const bool ok = d.at("ok").get<bool>();
  std::string row = fmt::format(
      "<tr class=\"{}\"><th scope=\"row\">{}<br><span class=\"status\">{}{}</span></th>",
      ok ? "ok" : "failed", esc(name), ok ? "ok" : "failed",
      d.value("resumed", false) ? ", resumed" : "");
  if (d.at("result").is_null()) {
    const json& e = d.at("error");
    const std::string why = e.is_null() ? std::string("did not run")
                                        : fmt::format("{}: {}", e.at("code").get<std::string>(),
                                                      e.at("message").get<std::string>());
    return row + fmt::format("<td class=\"error\" colspan=\"{}\">{}</td></tr>\n",
                             std::max<size_t>(columns.size(), 1), esc(why));
  }
  const std::vector<Agent> agents = page_agents(result_from_json(d.at("result")));
  for (const std::string& column : columns) {
    const auto it = std::find_if(agents.begin(), agents.end(),
                                 [&](const Agent& a) { return a.name == column; });
    if (it == agents.end()) {
      row += "<td></td>";
      continue;
    }
    if (!it->error.empty()) {
      row += fmt::format("<td class=\"error\">{}</td>", esc(it->error));
    } else if (!it->fields.empty()) {
      std::string fields;
      for (const auto& [key, value] : it->fields) {
        fields += fmt::format("<dt>{}</dt><dd>{}</dd>", esc(key), esc(value));
      }
      row += "<td><dl class=\"fields\">" + fields + "</dl></td>";
    } else {
      row += fmt::format("<td>{}</td>", esc(it->answer));
    }
  }
  return row + "</tr>\n";
}

std::string draw_corpus(const json& corpus, const std::string& source, int refresh_s) {
  const json& documents = corpus.at("documents");
  std::vector<std::string> columns;  // the per-document agents, from the first result
  for (const json& d : documents) {
    if (d.at("result").is_null()) continue;
    for (const json& a : d.at("result").at("agents"))
      columns.push_back(a.at("name").get<std::string>());
    break;
  }
  const std::string title =
      fmt::format("{} — {} documents", corpus.value("pipeline", "corpus"), documents.size());
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<link rel=\"icon\" href=\"data:,\">\n{2}<title>{0}</title>\n<style>{1}</style>\n"
      "</head>\n<body>\n<h1>{0}</h1>\n",
      esc(title), kStyle,
      refresh_s > 0 ? fmt::format("<meta http-equiv=\"refresh\" content=\"{}\">\n", refresh_s)
                    : std::string());
  html += fmt::format(
      "<dl class=\"facts\"><dt>result</dt><dd>{}</dd><dt>model</dt><dd>{}</dd><dt>fork</dt>"
      "<dd>{}</dd><dt>documents</dt><dd>{} run, {} resumed, {} failed</dd><dt>took</dt><dd>{}"
      "</dd>{}</dl>\n",
      corpus.contains("state")    ? esc(corpus.value("state", ""))
      : corpus.value("ok", false) ? std::string("ok")
                                  : std::string("failed"),
      esc(corpus.value("model", "")), esc(corpus.value("fork", "")),
      corpus.value("documents_run", 0), corpus.value("documents_resumed", 0),
      corpus.value("documents_failed", 0), esc(ms_text(corpus.value("total_ms", 0.0))),
      source.empty() ? std::string() : fmt::format("<dt>from</dt><dd>{}</dd>", esc(source)));
  html +=
      "<h2 id=\"documents\">Documents</h2>\n<div class=\"scroll\"><table class=\"runs corpus\">"
      "<tr><th>document</th>";
  for (const std::string& c : columns) html += fmt::format("<th>{}</th>", esc(c));
  html += "</tr>\n";
  for (const json& d : documents) html += corpus_row(d, columns);
  html += "</table></div>\n";
  if (const auto it = corpus.find("reduce"); it != corpus.end() && !it->is_null()) {
    html += "<h2 id=\"reduce\">Over every document</h2>\n";
    html += agents_html(page_agents(result_from_json(*it)));
  }
  return html + "</body>\n</html>\n";
}

}  // namespace

std::string corpus_page_html(const json& corpus, const std::string& source, int refresh_s) {
  try {
    if (!corpus.is_object() || !corpus.contains("documents")) {
      throw Error(ErrorCode::kCorruption,
                  "the result has no 'documents' (not a swarmkv run --json result of a corpus?)");
    }
    return draw_corpus(corpus, source, refresh_s);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("the corpus result does not read: {}", e.what()));
  }
}

std::string runs_index_html(const std::vector<RunSummary>& runs, const std::string& server,
                            int refresh_s) {
  std::string rows;
  bool going = false;
  for (const RunSummary& r : runs) {
    going = going || r.state == "queued" || r.state == "running";
    rows += fmt::format(
        "<tr id=\"run-{0}\"><td><a href=\"runs/{0}\">{0}</a></td><td><a href=\"runs/{0}\">{1}"
        "</a></td><td>{2}</td><td>{3} of {4}</td><td>{5}</td><td>{6}</td></tr>\n",
        esc(r.id), esc(r.pipeline), esc(r.state), r.agents_done, r.agents, esc(r.accepted),
        esc(ms_text(r.elapsed_ms)));
  }
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<link rel=\"icon\" href=\"data:,\">\n{0}"
      "<title>Runs — {1}</title>\n<style>{2}</style>\n</head>\n<body>\n<h1>Runs — {1}</h1>\n",
      going && refresh_s > 0
          ? fmt::format("<meta http-equiv=\"refresh\" content=\"{}\">\n", refresh_s)
          : std::string(),
      esc(server), kStyle);
  if (runs.empty()) {
    html +=
        "<p>No pipeline has been posted yet: POST /v1/pipelines runs one "
        "(docs/serve.md), and it shows here.</p>\n";
  } else {
    html += fmt::format(
        "<p>The last {} pipelines posted, newest first{}.</p>\n<table class=\"runs\">\n"
        "<tr><th>run</th><th>pipeline</th><th>state</th><th>agents done</th><th>accepted "
        "(UTC)</th><th>took</th></tr>\n{}</table>\n",
        runs.size(),
        going && refresh_s > 0
            ? fmt::format("; this page reloads every {} s while one runs", refresh_s)
            : "",
        rows);
  }
  return html + "</body>\n</html>\n";
}

std::string run_page_html(const json& result, const std::string& source, int refresh_s) {
  try {
    return draw(result, source, refresh_s);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kCorruption, fmt::format("the result does not read: {}", e.what()));
  }
}

}  // namespace swarmkv
