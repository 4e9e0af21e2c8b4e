// swarmkv_test_forge_cells FILE move|two-cells: rewrites a SmolLM2 snapshot
// file with its cells moved one position on (move) or with only its first
// and last cell left (two-cells), every checksum recomputed, as someone who
// can write to a worker's store or to Redis could (cluster_cli.py,
// a_damaged_store_entry_is_removed_and_made_again).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "hostile_payload.h"
#include "swarmkv/snapshot.h"

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[2] : "";
  if (mode != "move" && mode != "two-cells") {
    std::fprintf(stderr, "usage: swarmkv_test_forge_cells FILE move|two-cells\n");
    return 2;
  }
  const std::string path = argv[1];
  try {
    const swarmkv::SnapshotHeader h = swarmkv::read_snapshot_header(path);
    std::vector<uint8_t> payload = swarmkv::read_snapshot_payload(path, h);
    const uint32_t cells = mode == "move" ? swarmkv::test::move_cells_one_position_on(payload)
                                          : swarmkv::test::keep_first_and_last_cell(payload);
    swarmkv::write_snapshot(path, h.meta, payload);
    std::printf("%u cells: %s\n", cells, mode.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swarmkv_test_forge_cells: %s\n", e.what());
    return 1;
  }
  return 0;
}
