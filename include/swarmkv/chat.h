// The one chat layout of every front-end: a pipeline's prefix and branches
// (and the turn a `fork_from` child continues), a chat completion's prompt,
// and `swarmkv generate`. A chat meets a pipeline's stored prefix only when
// both are laid out alike, so there is one renderer.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "swarmkv/engine.h"

namespace swarmkv {

// `messages` as the model's chat template renders them
// (Model::apply_chat_template), or, for a model without one (a base model,
// such as Gemma 3 270M), in the fallback layout: a system message followed
// by a blank line, a user message by a newline, an assistant message as
// "Answer:" + its content + a blank line, and with `add_assistant` "Answer:"
// to open the answer. Contents go in as given: to keep them plain text,
// give markers and fill them in with Model::fill_placeholders (chat_tokens
// does). Throws Error(kChatTemplate) for a template llama.cpp cannot apply.
std::string render_chat(const Model& model, std::span<const ChatMessage> messages,
                        bool add_assistant);

// The chat as tokens, opening the answer: render_chat with each content as a
// plain-text piece (a message cannot open or close a turn), the template's
// markup as control tokens, BOS as the model adds it. Throws what
// render_chat and Model::tokenize throw.
std::vector<Token> chat_tokens(const Model& model, std::span<const ChatMessage> messages);

}  // namespace swarmkv
