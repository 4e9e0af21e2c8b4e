#include "info_cmd.h"

#include <iostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarmkv/engine.h"
#include "swarmkv/paths.h"
#include "swarmkv/result_json.h"

namespace swarmkv::cli {

InfoCommand::InfoCommand(CLI::App& app) {
  sub_ = app.add_subcommand("info", "Print the model's metadata and the llama.cpp build as JSON");
  sub_->add_option("-m,--model", model_, "GGUF model file (default: see above)");
}

int InfoCommand::run() const {
  const std::string model_path = resolve_model_path(model_);
  auto model = Model::load(model_path);
  nlohmann::json out = {
      {"model", model_path},
      {"description", model->description()},
      {"n_vocab", model->n_vocab()},
      {"n_layer", model->n_layer()},
      {"n_ctx_train", model->n_ctx_train()},
      {"size_bytes", model->size_bytes()},
      {"chat_template", model->has_chat_template()},
      {"engine", engine_build_info()},
      {"cache_dir", cache_dir()},
  };
  const std::vector<WeightType> weights = weight_types(*model);
  nlohmann::json types = nlohmann::json::array();
  for (const WeightType& w : weights) {
    types.push_back({{"type", w.type},
                     {"tensors", w.tensors},
                     {"bytes", w.bytes},
                     {"fast_prefill", w.fast_prefill}});
  }
  const std::string hint = slow_weights_hint(weights);
  out["weights"] = {{"types", types},
                    {"hint", hint.empty() ? nlohmann::json(nullptr) : nlohmann::json(hint)}};
  std::cout << dump_json(out) << "\n";
  if (!hint.empty()) std::cerr << "hint: " << hint << "\n";
  return 0;
}

}  // namespace swarmkv::cli
