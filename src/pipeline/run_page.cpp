// run_page_html: the graph (columns by depth), the timeline and the agents'
// texts of one result, as static HTML and SVG.
#include "swarmkv/run_page.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "swarmkv/error.h"

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

// The result's parts the page reads, checked once.
struct Agent {
  std::string name, status, answer, prompt, error, fork_from, needs, worker;
  std::vector<std::string> depends_on;
  double wait = 0, started = 0, first_token = 0, done = 0;
  std::vector<double> token_at;
  size_t n_tokens = 0;
  int depth = 1;
};

const json& need(const json& j, const char* key, const char* where) {
  if (!j.is_object() || !j.contains(key)) {
    throw Error(
        ErrorCode::kCorruption,
        fmt::format("the result has no '{}'{} (not a swarmkv run --json result?)", key, where));
  }
  return j.at(key);
}

std::vector<Agent> read_agents(const json& result) {
  const json& list = need(result, "agents", "");
  if (!list.is_array()) throw Error(ErrorCode::kCorruption, "the result's 'agents' is not a list");
  std::vector<Agent> out;
  for (const json& a : list) {
    const std::string where = fmt::format(" in agent {}", out.size());
    Agent x;
    try {
      x.name = need(a, "name", where.c_str()).get<std::string>();
      x.status = need(a, "status", where.c_str()).get<std::string>();
      x.answer = a.value("answer", "");
      x.prompt = a.value("prompt_rendered", "");
      if (a.contains("error") && a["error"].is_object()) {
        x.error = a["error"].value("code", "") + ": " + a["error"].value("message", "");
      }
      if (a.contains("fork_from") && a["fork_from"].is_string()) x.fork_from = a["fork_from"];
      if (a.contains("depends_on") && a["depends_on"].is_array())
        a["depends_on"].get_to(x.depends_on);
      if (a.contains("needs") && a["needs"].is_object()) {
        const json& n = a["needs"];
        x.needs = n.contains("tokens")
                      ? fmt::format("the first {} tokens", n["tokens"].get<int64_t>())
                      : fmt::format("up to \"{}\"", n.value("until", ""));
      }
      if (a.contains("worker") && a["worker"].is_string()) x.worker = a["worker"];
      x.started = a.value("started_at_ms", 0.0);
      x.first_token = a.value("first_token_at_ms", 0.0);
      x.done = a.value("done_at_ms", 0.0);
      if (a.contains("timings_ms")) x.wait = a["timings_ms"].value("wait", 0.0);
      if (a.contains("token_at_ms")) a["token_at_ms"].get_to(x.token_at);
      x.n_tokens = a.value("n_tokens", x.token_at.size());
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("agent {} of the result does not read: {}", out.size(), e.what()));
    }
    out.push_back(std::move(x));
  }
  // Depth: the document is 0, an agent one more than the deepest agent it
  // waits on (names it does not know and cycles count as the document).
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < out.size(); ++i) index.emplace(out[i].name, i);
  std::vector<int> state(out.size(), 0);  // 0 new, 1 visiting, 2 done
  std::function<int(size_t)> depth = [&](size_t i) -> int {
    if (state[i] == 2) return out[i].depth;
    if (state[i] == 1) return 0;
    state[i] = 1;
    int d = 1;
    std::vector<std::string> ups = out[i].depends_on;
    if (!out[i].fork_from.empty()) ups.push_back(out[i].fork_from);
    for (const std::string& u : ups) {
      const auto it = index.find(u);
      if (it != index.end() && it->second != i) d = std::max(d, depth(it->second) + 1);
    }
    state[i] = 2;
    out[i].depth = d;
    return d;
  };
  for (size_t i = 0; i < out.size(); ++i) depth(i);
  return out;
}

// A run still going on (a served page) has agents "waiting" and "running".
std::string status_text(const Agent& a) {
  if (a.status == "ok") return "ok";
  if (a.status == "dependency_failed") return "not run: a dependency failed";
  if (a.status == "waiting" || a.status == "running") return a.status;
  return "FAILED";
}

// The CSS class of its node and its article.
std::string_view status_class(const Agent& a) {
  if (a.status == "ok" || a.status == "failed" || a.status == "waiting" || a.status == "running")
    return a.status;
  return "skipped";
}

constexpr int kNodeW = 200, kNodeH = 46, kColW = 250, kRowH = 58, kPad = 16, kTopPad = 34;

std::string graph_svg(const std::vector<Agent>& agents) {
  int max_depth = 0;
  for (const Agent& a : agents) max_depth = std::max(max_depth, a.depth);
  std::vector<int> rows(static_cast<size_t>(max_depth) + 1, 0);
  std::vector<std::pair<int, int>> at(agents.size());  // x, y of each node's top left
  for (size_t i = 0; i < agents.size(); ++i) {
    const int d = agents[i].depth;
    at[i] = {kPad + d * kColW, kTopPad + rows[static_cast<size_t>(d)]++ * kRowH};
  }
  int tallest = 1;
  for (const int r : rows) tallest = std::max(tallest, r);
  const int width = kPad * 2 + max_depth * kColW + kNodeW;
  const int height = kTopPad + kPad + tallest * kRowH;
  const std::pair<int, int> doc{kPad, kTopPad};
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < agents.size(); ++i) index.emplace(agents[i].name, i);

  std::string edges, nodes, labels;
  const auto edge = [&](std::pair<int, int> from, std::pair<int, int> to, const char* cls,
                        const std::string& what) {
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
    edges += fmt::format(
        "<path class=\"edge {}\" d=\"{}\" marker-end=\"url(#arrow)\"><title>{}</title></path>\n",
        cls, d, esc(what));
  };
  for (size_t i = 0; i < agents.size(); ++i) {
    const Agent& a = agents[i];
    bool from_doc = true;
    for (const std::string& d : a.depends_on) {
      if (const auto it = index.find(d); it != index.end()) {
        edge(at[it->second], at[i], "depends", fmt::format("{} waits for {}", a.name, d));
        from_doc = false;
      }
    }
    if (const auto it = index.find(a.fork_from); !a.fork_from.empty() && it != index.end()) {
      edge(at[it->second], at[i], "fork",
           fmt::format("{} continues {}'s conversation (fork_from)", a.name, a.fork_from));
      from_doc = false;
    }
    if (from_doc) {
      edge(doc, at[i], a.needs.empty() ? "doc" : "needs",
           a.needs.empty() ? fmt::format("{} forks from the document", a.name)
                           : fmt::format("{} needs {} of the document", a.name, a.needs));
      if (!a.needs.empty()) {
        labels += fmt::format("<text class=\"needs-label\" x=\"{}\" y=\"{}\">needs {}</text>\n",
                              at[i].first, at[i].second - 3, esc(shorten(a.needs, 34)));
      }
    }
    nodes += fmt::format(
        "<a href=\"#agent-{0}\" id=\"node-{0}\"><g class=\"node {1}\">"
        "<title>{2}: {3}</title>"
        "<rect x=\"{4}\" y=\"{5}\" width=\"{6}\" height=\"{7}\" rx=\"6\"/>"
        "<text x=\"{8}\" y=\"{9}\" class=\"name\">{10}</text>"
        "<text x=\"{8}\" y=\"{11}\" class=\"sub\">{12}</text></g></a>\n",
        i, status_class(a), esc(a.name), esc(status_text(a)), at[i].first, at[i].second, kNodeW,
        kNodeH, at[i].first + 8, at[i].second + 19, esc(shorten(a.name, 26)), at[i].second + 37,
        esc(a.status == "ok" ? fmt::format("ok, {} tokens, done {}", a.n_tokens, ms_text(a.done))
            : a.status == "running" ? fmt::format("running, {} tokens", a.n_tokens)
                                    : shorten(status_text(a), 30)));
  }
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
      width, std::max(height, kTopPad + kPad + kRowH), edges, doc.first, doc.second, kNodeW, kNodeH,
      doc.first + 8, doc.second + 19, doc.second + 37, nodes, labels);
}

// A step of 1, 2 or 5 times a power of ten giving about `ticks` ticks.
double tick_step(double span, int ticks) {
  const double raw = span / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

std::string timeline_svg(const json& result, const std::vector<Agent>& agents) {
  constexpr int kLabelW = 190, kPlotW = 900, kBarH = 14, kLine = 22, kTop = 30;
  double t_max = result.value("total_ms", 0.0);
  const double prefill_done = result.value("prefill_done_at_ms", 0.0);
  t_max = std::max(t_max, prefill_done);
  for (const Agent& a : agents) t_max = std::max(t_max, a.done);
  if (t_max <= 0) t_max = 1;
  const auto x = [&](double t) { return kLabelW + std::clamp(t, 0.0, t_max) / t_max * kPlotW; };
  const int height = kTop + kLine * static_cast<int>(agents.size() + 1) + 10;
  std::string out = fmt::format(
      "<svg class=\"timeline\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" role=\"img\" "
      "aria-label=\"Timeline of the run\">\n"
      "<defs><pattern id=\"queued\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" class=\"queued-bg\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" class=\"queued-line\"/></pattern></defs>\n",
      kLabelW + kPlotW + 20, height);
  const double step = tick_step(t_max, 8);
  for (double t = 0; t <= t_max + 1e-9; t += step) {
    out += fmt::format(
        "<line class=\"tick\" x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>"
        "<text class=\"axis\" x=\"{0:.1f}\" y=\"{3}\">{4}</text>\n",
        x(t), kTop - 8, height - 6, kTop - 12, esc(ms_text(t)));
  }
  // The document: its prefill, or the restore of its snapshot.
  const json snapshot = result.contains("snapshot") ? result["snapshot"] : json();
  const std::string source = snapshot.is_object() ? snapshot.value("source", "prefill") : "";
  int y = kTop;
  std::string doc_text = "per agent (fork none)";
  if (prefill_done > 0) {
    const double took = source == "prefill" || source.empty()
                            ? result.value("prefill_ms", 0.0)
                            : snapshot.value("load_ms", 0.0) + result.value("restore_ms", 0.0);
    const double from = std::max(0.0, prefill_done - took);
    doc_text = source == "prefill" || source.empty()
                   ? fmt::format("prefill, {} tokens", result.value("prefix_tokens", 0))
                   : fmt::format("restored from {} ({} tokens)", source,
                                 snapshot.value("reused_tokens", 0));
    out += fmt::format(
        "<g id=\"bar-document\"><title>document: {0}, ready at {1}</title>"
        "<rect class=\"doc-bar\" x=\"{2:.1f}\" y=\"{3}\" width=\"{4:.1f}\" height=\"{5}\"/></g>\n",
        esc(doc_text), esc(ms_text(prefill_done)), x(from), y,
        std::max(1.0, x(prefill_done) - x(from)), kBarH);
  }
  out += fmt::format("<text class=\"label\" x=\"4\" y=\"{}\">document: {}</text>\n", y + 11,
                     esc(shorten(doc_text, 28)));
  for (size_t i = 0; i < agents.size(); ++i) {
    const Agent& a = agents[i];
    y += kLine;
    std::string row = fmt::format("<text class=\"label\" x=\"4\" y=\"{}\">{}</text>", y + 11,
                                  esc(shorten(a.name, 26)));
    const bool ran = a.done > 0 || a.started > 0;
    if (!ran) {
      row += fmt::format("<text class=\"note\" x=\"{}\" y=\"{}\">{}</text>", x(0) + 4, y + 11,
                         esc(status_text(a)));
    } else {
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
      const std::string_view failed = a.status == "ok" || a.status == "running" ? "" : " failed";
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
      if (a.status != "ok") {
        row += fmt::format("<text class=\"note\" x=\"{:.1f}\" y=\"{}\">{}</text>", x(a.done) + 4,
                           y + 11, esc(status_text(a)));
      }
    }
    out += fmt::format("<a href=\"#agent-{0}\" id=\"bar-{0}\"><g>{1}</g></a>\n", i, row);
  }
  return out + "</svg>";
}

// A served run's state ("live", RunView::result): what it does now.
std::string live_text(const json& live, size_t agents, size_t done, int refresh_s) {
  const std::string state = live.value("state", "");
  std::string text;
  if (state == "queued") {
    text = "queued: waiting for a free pipeline worker";
  } else if (state == "running") {
    const size_t prefilled = live.value("prefill_done", size_t{0});
    const size_t total = live.value("prefill_total", size_t{0});
    text = prefilled < total
               ? fmt::format("running: the document's prefill, {} of {} tokens", prefilled, total)
               : fmt::format("running: {} of {} agents done", done, agents);
  } else if (state == "failed" && live.contains("error") && live["error"].is_object()) {
    text = "could not run: " + live["error"].value("code", "") + ": " +
           live["error"].value("message", "");
  } else {
    text = state == "ok" ? "done" : state;
  }
  if (refresh_s > 0)
    text += fmt::format(" (this page reloads every {} s until the run ends)", refresh_s);
  return text;
}

std::string header_html(const json& r, const std::vector<Agent>& agents, const std::string& source,
                        int refresh_s) {
  size_t ok = 0, failed = 0, skipped = 0, running = 0, waiting = 0;
  for (const Agent& a : agents) {
    (a.status == "ok"        ? ok
     : a.status == "failed"  ? failed
     : a.status == "running" ? running
     : a.status == "waiting" ? waiting
                             : skipped)++;
  }
  std::string rows;
  const auto row = [&](const std::string& k, const std::string& v) {
    rows += fmt::format("<dt>{}</dt><dd>{}</dd>\n", esc(k), esc(v));
  };
  if (r.contains("live") && r["live"].is_object()) {
    rows += fmt::format("<dt>state</dt><dd id=\"state\">{}</dd>\n",
                        esc(live_text(r["live"], agents.size(), ok + failed + skipped, refresh_s)));
  }
  row("model", r.value("model", "(not in this result)"));
  if (!source.empty()) row("result from", source);
  row("fork", r.value("fork", "?"));
  const bool exact = r.value("exact", false);
  row("exact", exact ? "yes (every answer equals a re-prefill's)"
               : r.contains("exact_unavailable") && r["exact_unavailable"].is_string()
                   ? "no: " + r["exact_unavailable"].get<std::string>()
                   : "no");
  if (r.contains("engine") && r["engine"].is_object()) {
    const json& e = r["engine"];
    row("engine",
        fmt::format("KV {}, flash attention {}, {} threads ({} batch), n_batch {}",
                    e.value("kv_type", "?"), e.value("flash_attn", false) ? "on" : "off",
                    e.value("threads", 0), e.value("threads_batch", 0), e.value("n_batch", 0)));
  }
  const json snapshot = r.contains("snapshot") ? r["snapshot"] : json();
  if (snapshot.is_object()) {
    const std::string path = snapshot.value("path", "");
    row("document's KV",
        fmt::format("{}: {} tokens reused, {} prefilled{}", snapshot.value("source", "?"),
                    snapshot.value("reused_tokens", 0), snapshot.value("prefilled_tokens", 0),
                    path.empty() ? "" : " (" + path + ")"));
  }
  const bool ready = r.contains("prefill_done_at_ms") &&
                     !(r.contains("live") && r["live"].value("prefill_done", size_t{0}) <
                                                 r["live"].value("prefill_total", size_t{0}));
  row("document", ready ? fmt::format("{} tokens, ready at {}", r.value("prefix_tokens", 0),
                                      ms_text(r.value("prefill_done_at_ms", 0.0)))
                        : fmt::format("{} tokens, not ready yet", r.value("prefix_tokens", 0)));
  std::string counts = fmt::format("{} ok, {} failed, {} not run", ok, failed, skipped);
  if (running + waiting > 0) counts += fmt::format(", {} running, {} waiting", running, waiting);
  row("agents", counts);
  row("total", ms_text(r.value("total_ms", 0.0)) + " (model load excluded)");
  if (r.contains("latency") && r["latency"].is_object()) {
    const json& l = r["latency"];
    const auto pct = [&](const char* key) {
      if (!l.contains(key)) return std::string("?");
      const json& p = l[key];
      return fmt::format("p50 {} · p95 {} · p99 {}", ms_text(p.value("p50", 0.0)),
                         ms_text(p.value("p95", 0.0)), ms_text(p.value("p99", 0.0)));
    };
    row("time to first token", pct("ttft_ms"));
    row("completion", pct("completion_ms"));
  }
  return "<dl class=\"facts\">\n" + rows + "</dl>\n";
}

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
    out += fmt::format(
        "<details><summary>Prompt, as rendered</summary><pre>{}</pre></details>\n"
        "<pre class=\"answer\">{}</pre>\n</article>\n",
        esc(a.prompt.empty() ? "(not rendered: the agent never started)" : a.prompt),
        esc(a.answer));
  }
  return out;
}

constexpr std::string_view kStyle = R"(
body{font-family:system-ui,sans-serif;margin:1.5em;color:#111;max-width:1200px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}
dl.facts dt{font-weight:600}dl.facts dd{margin:0}
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
table.runs{border-collapse:collapse}table.runs td,table.runs th{border:1px solid #ccc;padding:.2em .6em;text-align:left}
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
  if (!result.is_object()) {
    throw Error(ErrorCode::kCorruption,
                "the result is not a JSON object (not a swarmkv run --json result?)");
  }
  const std::vector<Agent> agents = read_agents(result);
  const std::string title = fmt::format(
      "{} — {} agents", result.value("pipeline", std::string("pipeline")), agents.size());
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
      esc(title), kStyle, header_html(result, agents, source, refresh_s),
      refresh_s > 0 ? fmt::format("<meta http-equiv=\"refresh\" content=\"{}\">\n", refresh_s)
                    : std::string());
  html += "<h2 id=\"graph\">Graph</h2>\n";
  html += legend({{line("doc"), "from the document"},
                  {line("depends"), "depends_on (waits for)"},
                  {line("fork"), "fork_from (continues the conversation)"},
                  {line("needs"), "needs a part of the document (watermark)"}});
  html += "<div class=\"scroll\">" + graph_svg(agents) + "</div>\n";
  html += "<h2 id=\"timeline\">Timeline</h2>\n";
  html += legend({{box("doc-bar"), "document prefill or restore"},
                  {box("queued"), "queued (ready, waiting)"},
                  {box("prompt"), "started → first token"},
                  {box("generate"), "generating → done"},
                  {box("prompt failed"), "failed"}});
  html += "<div class=\"scroll\">" + timeline_svg(result, agents) + "</div>\n";
  html +=
      "<p>Ticks under a bar: each token's time. Times from the run's start (model load "
      "excluded).</p>\n<h2 id=\"agents\">Agents</h2>\n";
  html += agents_html(agents);
  return html + "</body>\n</html>\n";
}

}  // namespace

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
