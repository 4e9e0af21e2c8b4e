// How many of a corpus's documents run at once when memory is tight: each
// document takes its estimated bytes from a budget (what was available when
// the corpus started) and gives them back when it ends; one that does not
// fit waits for another to end, unless none runs (then it runs alone, and
// its own memory check says whether it fits at all). So documents that
// --max-documents-live lets run together never ask for more than the
// machine had, and a tight machine runs fewer at once instead of failing
// documents with "not enough memory". Pure: tested without a model.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace swarmkv::detail {

class MemoryGate {
 public:
  explicit MemoryGate(uint64_t budget) : budget_(budget) {}

  // Blocks until `bytes` fit beside what the running documents hold (or
  // none runs), then holds them.
  void acquire(uint64_t bytes) {
    std::unique_lock lock(mutex_);
    freed_.wait(lock,
                [&] { return running_ == 0 || (used_ <= budget_ && bytes <= budget_ - used_); });
    used_ += bytes;
    ++running_;
    peak_ = std::max(peak_, running_);
  }

  void release(uint64_t bytes) {
    {
      const std::lock_guard lock(mutex_);
      used_ -= bytes;
      --running_;
    }
    freed_.notify_all();
  }

  // The most documents that held memory at once.
  size_t peak() const {
    const std::lock_guard lock(mutex_);
    return peak_;
  }

  // acquire() for a scope.
  class Hold {
   public:
    Hold(MemoryGate& gate, uint64_t bytes) : gate_(gate), bytes_(bytes) { gate_.acquire(bytes_); }
    ~Hold() { gate_.release(bytes_); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    MemoryGate& gate_;
    uint64_t bytes_;
  };

 private:
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  const uint64_t budget_;
  uint64_t used_ = 0;
  size_t running_ = 0;
  size_t peak_ = 0;
};

}  // namespace swarmkv::detail
