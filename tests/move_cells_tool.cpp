// swarmkv_test_move_cells FILE: rewrites a SmolLM2 snapshot file with its
// cells moved one position on and every checksum recomputed, as someone
// who can write to a worker's store or to Redis could
// (cluster_cli.py, a_damaged_store_entry_is_removed_and_made_again).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "hostile_payload.h"
#include "swarmkv/snapshot.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: swarmkv_test_move_cells FILE\n");
    return 2;
  }
  const std::string path = argv[1];
  try {
    const swarmkv::SnapshotHeader h = swarmkv::read_snapshot_header(path);
    std::vector<uint8_t> payload = swarmkv::read_snapshot_payload(path, h);
    const uint32_t cells = swarmkv::test::move_cells_one_position_on(payload);
    swarmkv::write_snapshot(path, h.meta, payload);
    std::printf("%u cells moved\n", cells);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swarmkv_test_move_cells: %s\n", e.what());
    return 1;
  }
  return 0;
}
