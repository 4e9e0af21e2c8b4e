#include "pipeline/host_buffer_pool.h"

#include <cstring>

namespace swarmkv::detail {

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr && data_) pool_->give_back(std::move(data_), capacity_);
    pool_ = other.pool_;
    data_ = std::move(other.data_);
    capacity_ = other.capacity_;
    size_ = other.size_;
    other.pool_ = nullptr;
    other.capacity_ = other.size_ = 0;
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  if (pool_ != nullptr && data_) pool_->give_back(std::move(data_), capacity_);
}

HostBuffer HostBufferPool::acquire(std::size_t size) {
  {
    std::lock_guard lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= size) {
        auto data = std::move(it->first);
        const std::size_t capacity = it->second;
        free_.erase(it);
        return HostBuffer(this, std::move(data), capacity, size);
      }
    }
    ++allocations_;
  }
  // for_overwrite skips value-initialisation; the memset below is the
  // deliberate pre-fault, outside the lock.
  auto data = std::make_unique_for_overwrite<std::uint8_t[]>(size == 0 ? 1 : size);
  std::memset(data.get(), 0, size);
  return HostBuffer(this, std::move(data), size, size);
}

void HostBufferPool::give_back(std::unique_ptr<std::uint8_t[]> data, std::size_t capacity) {
  std::lock_guard lock(mutex_);
  free_.emplace_back(std::move(data), capacity);
}

std::size_t HostBufferPool::allocations() const {
  std::lock_guard lock(mutex_);
  return allocations_;
}

}  // namespace swarmkv::detail
