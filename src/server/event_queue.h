// The events of one request, from the thread that makes them to the HTTP
// handler that sends them. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

namespace swarmkv::server {

template <typename T>
class EventQueue {
 public:
  void push(T event) {
    {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(event));
    }
    ready_.notify_all();
  }
  // The oldest event, or nullopt when none came within `timeout`.
  std::optional<T> next(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    T e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> events_;  // guarded by mutex_
};

}  // namespace swarmkv::server
