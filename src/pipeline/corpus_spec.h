// Finding a corpus's documents: files, folders and globs, checked before
// any work and read only when each one's turn comes.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "swarmkv/pipeline.h"

namespace swarmkv::detail {

// `file` as a document named after its file name, once checked: a regular
// file that can be opened, with no NUL byte in its first 4 KiB. Throws
// Error(kNotFound) for a missing file, Error(kInvalidArgument) "... is a
// directory, not a file", "cannot read '<path>': <why>", "'<path>' is a
// binary file (a NUL byte at offset N); documents are text".
DocumentRef checked_document_file(const std::filesystem::path& file);

// The documents `pattern` names, relative to `base`: a file; a folder's
// regular files (not hidden ones), sorted by name; or a glob's matches
// (`*`, `?`, `[...]`), sorted, folders among them skipped. Each checked as
// checked_document_file does. Throws Error(kInvalidArgument) "'<pattern>'
// matches no file" (also for an empty folder).
std::vector<DocumentRef> expand_documents(const std::string& pattern,
                                          const std::filesystem::path& base);

}  // namespace swarmkv::detail
