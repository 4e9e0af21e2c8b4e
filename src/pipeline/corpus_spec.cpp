// A corpus's documents and its checks without a model (swarmkv/pipeline.h):
// the per-document agents as a pipeline checks them, the reduce agents as
// a pipeline without a document whose corpus placeholders are given.
#include "pipeline/corpus_spec.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "swarmkv/error.h"
#include "swarmkv/paths.h"

namespace swarmkv {
namespace detail {

DocumentRef checked_document_file(const std::filesystem::path& file) {
  const std::string path = file.string();
  require_regular_file(path, "document file");
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("cannot read document file '{}': {}", path, std::strerror(errno)));
  }
  char head[4096];
  in.read(head, sizeof head);
  const std::string_view seen(head, static_cast<size_t>(in.gcount()));
  if (const size_t nul = seen.find('\0'); nul != std::string_view::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("document file '{}' is a binary file (a NUL byte at offset {}); "
                            "documents are text",
                            path, nul));
  }
  DocumentRef doc;
  doc.path = path;
  doc.name = file.filename().string();
  return doc;
}

std::vector<DocumentRef> expand_documents(const std::string& pattern,
                                          const std::filesystem::path& base) {
  std::filesystem::path where(pattern);
  if (where.is_relative()) where = base / where;
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  if (std::filesystem::is_directory(where, ec)) {
    for (const auto& entry : std::filesystem::directory_iterator(where, ec)) {
      if (entry.path().filename().string().starts_with(".")) continue;
      if (entry.is_regular_file(ec)) files.push_back(entry.path());
    }
  } else if (pattern.find_first_of("*?[") == std::string::npos) {
    files.push_back(where);  // a plain file: missing or not a file is checked below
  } else {
    glob_t found{};
    const int rc = ::glob(where.c_str(), 0, nullptr, &found);
    for (size_t i = 0; rc == 0 && i < found.gl_pathc; ++i) {
      const std::filesystem::path match(found.gl_pathv[i]);
      if (!std::filesystem::is_directory(match, ec)) files.push_back(match);
    }
    ::globfree(&found);
  }
  if (files.empty()) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("'{}' matches no file", pattern));
  }
  std::sort(files.begin(), files.end());
  std::vector<DocumentRef> out;
  out.reserve(files.size());
  for (const auto& f : files) out.push_back(checked_document_file(f));
  return out;
}

}  // namespace detail

PipelineSpec document_pipeline(const CorpusSpec& corpus, const DocumentRef& d, std::string text) {
  PipelineSpec spec = corpus.pipeline;
  spec.document = std::move(text);
  spec.document_source = d.source();
  return spec;
}

PipelineSpec reduce_stage(const CorpusSpec& corpus,
                          const std::map<std::string, std::string>& inputs,
                          const std::vector<bool>& keep) {
  PipelineSpec stage;
  static_cast<EngineSettings&>(stage) = corpus.pipeline;
  stage.name = corpus.pipeline.name + " (reduce)";
  stage.model = corpus.pipeline.model;
  stage.fork = corpus.pipeline.fork;
  stage.max_live = corpus.pipeline.max_live;
  stage.system_prompt = corpus.pipeline.system_prompt;
  stage.no_document = true;
  for (size_t i = 0; i < corpus.reduce.size(); ++i) {
    if (!keep.empty() && !keep[i]) continue;
    AgentSpec a = corpus.reduce[i];
    for (const PromptPlaceholder& h : prompt_placeholders(a.prompt)) {
      if (!corpus_placeholder(corpus, h.name)) continue;
      const auto given = inputs.find(h.name);
      stage.inputs[h.name] = given == inputs.end() ? std::string() : given->second;
    }
    std::erase_if(a.depends_on,
                  [&](const std::string& d) { return corpus.pipeline.agent_index(d).has_value(); });
    stage.agents.push_back(std::move(a));
  }
  return stage;
}

std::optional<CorpusPlaceholder> corpus_placeholder(const CorpusSpec& corpus,
                                                    std::string_view text) {
  const auto per_document = [&](std::string_view name) {
    return corpus.pipeline.agent_index(name).has_value();
  };
  const size_t split = text.find_first_of("[@.");
  const std::string_view agent = text.substr(0, split);
  if (!per_document(agent)) return std::nullopt;
  if (split == std::string_view::npos || text[split] == '.' ||
      (text[split] == '[' && text.substr(split, 3) != "[*]")) {
    throw Error(ErrorCode::kGraph,
                fmt::format("{{{{{}}}}} names '{}', an agent that runs once per document: take "
                            "{{{{{}[*]}}}} (its answer in every document) or {{{{{}@NAME}}}} (in "
                            "the document NAME)",
                            text, agent, agent, agent));
  }
  CorpusPlaceholder out;
  out.agent = std::string(agent);
  std::string_view rest;
  if (text[split] == '[') {
    rest = text.substr(split + 3);
  } else {
    const std::string_view after = text.substr(split + 1);
    size_t best = 0;
    for (const DocumentRef& d : corpus.documents) {
      if (d.name.size() > best && after.starts_with(d.name) &&
          (after.size() == d.name.size() || after[d.name.size()] == '.' ||
           after[d.name.size()] == '[')) {
        best = d.name.size();
      }
    }
    if (best == 0) {
      throw Error(ErrorCode::kGraph,
                  fmt::format("{{{{{}}}}}: no document is named '{}'", text, after));
    }
    out.document = std::string(after.substr(0, best));
    rest = after.substr(best);
  }
  if (!rest.empty()) {
    // The path as a pipeline's placeholder reads it (refused there when it does not parse).
    const std::string whole = out.agent + std::string(rest);
    std::optional<PlaceholderRef> ref;
    try {
      ref = resolve_placeholder(whole, [&](std::string_view n) { return n == agent; });
    } catch (const Error& e) {
      throw Error(ErrorCode::kGraph, fmt::format("{{{{{}}}}}: {}", text, e.message()));
    }
    if (!ref) {
      throw Error(ErrorCode::kGraph,
                  fmt::format("{{{{{}}}}}: '{}' is not a field path", text, std::string(rest)));
    }
    out.field = ref->field;
  }
  return out;
}

void validate_corpus(const CorpusSpec& corpus) {
  if (corpus.documents.empty())
    throw Error(ErrorCode::kInvalidArgument, "the corpus has no documents");
  std::unordered_map<std::string_view, const DocumentRef*> names;
  for (const DocumentRef& d : corpus.documents) {
    if (d.name.empty())
      throw Error(ErrorCode::kInvalidArgument, "a document of the corpus has an empty name");
    if (const auto [it, fresh] = names.emplace(d.name, &d); !fresh) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("two documents are named '{}' ({} and {}); names must be unique "
                              "(they key the answers: {{{{agent@NAME}}}}); rename one, or give a "
                              "text item its own 'name'",
                              d.name, it->second->source(), d.source()));
    }
    if (d.path.empty()) require_text(d.text, fmt::format("document '{}'", d.name));
  }
  if (corpus.pipeline.agents.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "the corpus has no per-document agents (scope: document, the default)");
  }
  // The per-document pipeline with a stand-in document: `needs.until` is
  // checked in each document's run.
  PipelineSpec per_document = corpus.pipeline;
  per_document.document = "the corpus's documents";
  per_document.document_source = "text";
  for (AgentSpec& a : per_document.agents) a.needs.until.clear();
  validate_pipeline(per_document);
  if (corpus.reduce.empty()) return;
  for (const AgentSpec& a : corpus.reduce) {
    if (corpus.pipeline.agent_index(a.name)) {
      throw Error(ErrorCode::kGraph,
                  fmt::format("agent name '{}' is given twice (a per-document and a reduce agent)",
                              a.name));
    }
    if (!a.fork_from.empty() && corpus.pipeline.agent_index(a.fork_from)) {
      throw Error(ErrorCode::kGraph,
                  fmt::format("reduce agent '{}': fork_from names '{}', an agent that runs once "
                              "per document; a reduce agent forks from another reduce agent",
                              a.name, a.fork_from));
    }
    for (const PromptPlaceholder& h : prompt_placeholders(a.prompt)) {
      try {
        (void)corpus_placeholder(corpus, h.name);
      } catch (const Error& e) {
        throw Error(e.code(), fmt::format("reduce agent '{}': {}", a.name, e.message()));
      }
    }
  }
  validate_pipeline(reduce_stage(corpus));
}

std::vector<DocumentRef> documents_from_args(const std::vector<std::string>& args) {
  std::vector<DocumentRef> out;
  bool stdin_read = false;
  for (const std::string& arg : args) {
    if (arg == "-") {
      if (stdin_read)
        throw Error(ErrorCode::kInvalidArgument, "--document -: standard input is given twice");
      stdin_read = true;
      DocumentRef doc;
      doc.name = "stdin";
      doc.text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      require_text(doc.text, "the document on standard input");
      out.push_back(std::move(doc));
      continue;
    }
    try {
      for (DocumentRef& d : detail::expand_documents(arg, std::filesystem::current_path()))
        out.push_back(std::move(d));
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("--document {}: {}", arg, e.message()));
    }
  }
  return out;
}

}  // namespace swarmkv
