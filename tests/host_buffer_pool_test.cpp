#include "pipeline/host_buffer_pool.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace swarmkv::detail {
namespace {

TEST(HostBufferPoolTest, ReleasedBuffersAreReusedNotReallocated) {
  HostBufferPool pool;
  const std::uint8_t* first = nullptr;
  {
    HostBuffer a = pool.acquire(1 << 20);
    ASSERT_EQ(a.size(), 1u << 20);
    first = a.bytes().data();
    a.bytes()[0] = 7;
  }
  HostBuffer b = pool.acquire(1000);  // smaller: the released buffer fits
  EXPECT_EQ(b.bytes().data(), first);
  EXPECT_EQ(b.size(), 1000u);
  EXPECT_EQ(pool.allocations(), 1u);
  HostBuffer c = pool.acquire(1000);  // b is still out: a second allocation
  EXPECT_NE(c.bytes().data(), first);
  EXPECT_EQ(pool.allocations(), 2u);
}

TEST(HostBufferPoolTest, NewBuffersArePrefaultedToZero) {
  HostBufferPool pool;
  HostBuffer a = pool.acquire(3 * 4096 + 5);
  for (std::uint8_t v : a.bytes()) ASSERT_EQ(v, 0);
}

TEST(HostBufferPoolTest, TruncateOnlyShrinks) {
  HostBufferPool pool;
  HostBuffer a = pool.acquire(100);
  a.truncate(40);
  EXPECT_EQ(a.size(), 40u);
  a.truncate(400);
  EXPECT_EQ(a.size(), 40u);
}

TEST(HostBufferPoolTest, MoveAssignmentReturnsTheOldBuffer) {
  HostBufferPool pool;
  HostBuffer a = pool.acquire(64);
  a = pool.acquire(64);
  EXPECT_EQ(pool.allocations(), 2u);
  HostBuffer b = pool.acquire(64);  // the first one came back
  EXPECT_EQ(pool.allocations(), 2u);
}

TEST(HostBufferPoolTest, ConcurrentAcquireAndReleaseIsSafe) {
  HostBufferPool pool;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool] {
      for (int i = 0; i < 200; ++i) {
        HostBuffer b = pool.acquire(4096);
        b.bytes()[i % 4096] = static_cast<std::uint8_t>(i);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(pool.allocations(), 4u);
}

}  // namespace
}  // namespace swarmkv::detail
