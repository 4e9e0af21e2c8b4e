#include "swarmkv/chat.h"

#include <fmt/format.h>

namespace swarmkv {

std::string render_chat(const Model& model, std::span<const ChatMessage> messages,
                        bool add_assistant) {
  if (model.has_chat_template()) return model.apply_chat_template(messages, add_assistant);
  std::string out;
  for (const ChatMessage& m : messages) {
    if (m.role == "assistant") {
      out += "Answer:" + m.content + "\n\n";
    } else {
      out += m.content + (m.role == "system" ? "\n\n" : "\n");
    }
  }
  if (add_assistant) out += "Answer:";
  return out;
}

std::vector<Token> chat_tokens(const Model& model, std::span<const ChatMessage> messages) {
  std::vector<std::string> markers;
  std::vector<ChatMessage> marked;
  for (size_t i = 0; i < messages.size(); ++i) {
    markers.push_back(fmt::format("\x1f<swarmkv-message-{}>\x1f", i));
    marked.push_back({messages[i].role, markers.back()});
  }
  std::vector<Model::Placeholder> contents;
  for (size_t i = 0; i < messages.size(); ++i)
    contents.emplace_back(markers[i], messages[i].content);
  const std::string rendered = render_chat(model, marked, /*add_assistant=*/true);
  return model.tokenize(Model::fill_placeholders(rendered, contents), /*add_special=*/true);
}

}  // namespace swarmkv
