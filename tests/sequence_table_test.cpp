// The sequence table without a model: a fake cache records the operations
// it is asked for, and the table's counts are checked against them.
#include "kv/sequence_table.h"

#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <gtest/gtest.h>

namespace swarmkv::detail {
namespace {

class RecordingKv final : public KvOps {
 public:
  void seq_cp(SeqId src, SeqId dst, Pos p0, Pos p1) override {
    ops.push_back(fmt::format("cp {}->{} [{},{})", src, dst, p0, p1));
  }
  void seq_rm(SeqId seq) override { ops.push_back(fmt::format("rm {}", seq)); }
  void memory_clear() override { ops.push_back("clear"); }
  std::vector<std::string> ops;
};

TEST(SequenceTableTest, AForkSharesItsSourcesCells) {
  RecordingKv kv;
  SequenceTable table(kv, 3, /*keep_cells=*/false);
  table.decoded(0, 5);
  table.fork(1, 0, 3);  // part of the source
  table.fork(2, 0, 5);  // all of it
  EXPECT_EQ(kv.ops, (std::vector<std::string>{"cp 0->1 [-1,3)", "cp 0->2 [-1,-1)"}));
  EXPECT_EQ(table.length(0), 5U);
  EXPECT_EQ(table.length(1), 3U);
  EXPECT_EQ(table.length(2), 5U);
  EXPECT_EQ(table.cells_in_use(), 5U);  // no cell copied
  table.decoded(1, 2);                  // the branch's own tokens: new cells
  EXPECT_EQ(table.length(1), 5U);
  EXPECT_EQ(table.cells_in_use(), 7U);
  EXPECT_EQ(table.frontier(), 7U);
}

TEST(SequenceTableTest, FreeingReleasesOnlyCellsNoOtherSequenceHolds) {
  RecordingKv kv;
  SequenceTable table(kv, 2, /*keep_cells=*/false);
  EXPECT_EQ(table.park(), -1);
  table.decoded(0, 4);
  table.fork(1, 0, 4);
  table.decoded(1, 3);
  table.free(0);
  EXPECT_EQ(table.length(0), 0U);
  EXPECT_EQ(table.cells_in_use(), 7U);  // sequence 1 still holds the shared four
  EXPECT_EQ(table.cells_taken(), 7U);
  table.free(1);
  EXPECT_EQ(table.cells_in_use(), 0U);
  EXPECT_EQ(table.cells_taken(), 0U);
  EXPECT_EQ(table.frontier(), 7U);
  EXPECT_EQ(kv.ops, (std::vector<std::string>{"cp 0->1 [-1,-1)", "rm 0", "rm 1"}));
}

TEST(SequenceTableTest, KeptCellsGoToTheParkAndCountUntilTheCacheStartsOver) {
  RecordingKv kv;
  SequenceTable table(kv, 2, /*keep_cells=*/true);
  EXPECT_EQ(table.park(), 2);
  table.decoded(0, 4);
  table.fork(1, 0, 2);
  table.decoded(1, 1);
  table.free(1);
  table.free(1);  // empty now: nothing to park
  EXPECT_EQ(kv.ops,
            (std::vector<std::string>{"cp 0->1 [-1,2)", "cp 1->2 [-1,-1)", "rm 1", "rm 1"}));
  EXPECT_EQ(table.cells_in_use(), 4U);
  EXPECT_EQ(table.cells_taken(), 5U);  // the parked cell is not handed out again
  table.start_over();
  EXPECT_EQ(kv.ops.back(), "clear");
  EXPECT_EQ(table.length(0), 0U);
  EXPECT_EQ(table.cells_taken(), 0U);
  EXPECT_EQ(table.cells_in_use(), 0U);
}

TEST(SequenceTableTest, ImpossibleForksAndIdsAreInternalErrors) {
  RecordingKv kv;
  SequenceTable table(kv, 2, /*keep_cells=*/false);
  table.decoded(0, 3);
  const auto code_of = [](auto&& f) -> std::optional<ErrorCode> {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return std::nullopt;
  };
  EXPECT_EQ(code_of([&] { table.fork(1, 0, 4); }), ErrorCode::kInternal);  // more than it holds
  EXPECT_EQ(code_of([&] { table.fork(0, 0, 1); }), ErrorCode::kInternal);  // itself
  table.fork(1, 0, 1);
  EXPECT_EQ(code_of([&] { table.fork(1, 0, 1); }), ErrorCode::kInternal);  // not empty
  EXPECT_EQ(code_of([&] { table.decoded(2, 1); }), ErrorCode::kInternal);  // no such id
  EXPECT_EQ(code_of([&] { table.free(-1); }), ErrorCode::kInternal);
  EXPECT_EQ(code_of([] {
              RecordingKv k;
              SequenceTable t(k, 0, false);
            }),
            ErrorCode::kInternal);
  EXPECT_EQ(kv.ops, (std::vector<std::string>{"cp 0->1 [-1,1)"}));
}

}  // namespace
}  // namespace swarmkv::detail
