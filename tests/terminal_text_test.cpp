// What `swarmkv run` and `generate` print of a pipeline's text on a terminal.
#include <gtest/gtest.h>

#include "terminal_text.h"

namespace {

using swarmkv::cli::terminal_safe;

TEST(TerminalText, EscapeSequencesAreShownNotObeyed) {
  EXPECT_EQ(terminal_safe("a\x1b]0;pwned\x07"), "a\\x1b]0;pwned\\x07");
  EXPECT_EQ(terminal_safe("\x1b[2J\x1b[H"), "\\x1b[2J\\x1b[H");
  EXPECT_EQ(terminal_safe("over\rwrite\b\x7f"), "over\\x0dwrite\\x08\\x7f");
}

TEST(TerminalText, C1ControlsAreShownAsCodePoints) {
  // U+009B is CSI on terminals that read C1 controls in UTF-8.
  EXPECT_EQ(terminal_safe("x\xc2\x9b"
                          "2J"),
            "x\\u009b2J");
  EXPECT_EQ(terminal_safe("\xc2\x80\xc2\x9f"), "\\u0080\\u009f");
}

TEST(TerminalText, TextIsKeptAsItIs) {
  const std::string text = "line one\n\tindented: \xc2\xa0 caf\xc3\xa9 \xf0\x9f\x98\x80 \xc2";
  EXPECT_EQ(terminal_safe(text), text);
  EXPECT_EQ(terminal_safe(""), "");
}

TEST(TerminalText, OneLineFieldsEscapeNewlinesAndTabsToo) {
  EXPECT_EQ(terminal_safe("a\nb\tc\x1b", /*keep_lines=*/false), "a\\x0ab\\x09c\\x1b");
}

}  // namespace
