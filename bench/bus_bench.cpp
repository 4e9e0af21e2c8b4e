// swarmkv_bus_bench: publish and fetch one snapshot file through the Redis
// snapshot bus, the way `run --redis` and `swarmkv worker` do, and time
// both. Each trial publishes under a fresh key (so no publish is skipped),
// fetches it back, checks the bytes are equal and removes the key. Prints
// one JSON object: {"bytes", "chunk_bytes", "trials": [{"publish_ms",
// "fetch_ms"}...], "publish_ms_median", "fetch_ms_median",
// "publish_mb_s", "fetch_mb_s"} (MB = 10^6 bytes). bench/cluster_transfer.py
// runs it over loopback and over rate-limited links between namespaces.
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "swarmkv/cluster.h"
#include "swarmkv/error.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"

int main(int argc, char** argv) {
  CLI::App app{"Time the Redis snapshot bus: publish and fetch one snapshot file"};
  std::string url;
  std::string file;
  int trials = 3;
  uint64_t chunk_bytes = swarmkv::cluster::BusOptions{}.chunk_bytes;
  app.add_option("--redis", url, "redis://[user:password@]host:port")->required();
  app.add_option("--file", file, "a snapshot file (swarmkv prefill --out)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--trials", trials, "trials")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--chunk-bytes", chunk_bytes, "bus chunk size")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  CLI11_PARSE(app, argc, argv);
  try {
    const std::string text = swarmkv::read_file(file, "--file");
    const std::vector<uint8_t> bytes(text.begin(), text.end());
    swarmkv::redis::ClientOptions client;
    client.command_timeout_s = 600;  // a 10 Mbit/s link moves 4 MiB chunks in seconds
    swarmkv::redis::Client redis(swarmkv::redis::parse_url(url), client);
    swarmkv::cluster::BusOptions bus;
    bus.chunk_bytes = chunk_bytes;
    bus.ttl_s = 600;
    nlohmann::json rows = nlohmann::json::array();
    std::vector<double> pub, fetch;
    for (int t = 0; t < trials; ++t) {
      const std::string key = fmt::format("bench-{}-{}", ::getpid(), t);
      const swarmkv::cluster::PublishReport p =
          swarmkv::cluster::publish_snapshot(redis, key, bytes, bus);
      swarmkv::cluster::FetchReport f;
      const std::vector<uint8_t> back =
          swarmkv::cluster::fetch_snapshot(redis, key, bus.cluster_key, &f);
      if (back != bytes)
        throw swarmkv::Error(swarmkv::ErrorCode::kInternal, "fetched bytes differ");
      const std::optional<swarmkv::cluster::Manifest> m =
          swarmkv::cluster::find_snapshot(redis, key, bus.cluster_key);
      for (size_t i = 0; m && i < m->chunk_xxh3.size(); ++i)
        redis.command({"DEL", fmt::format("swarmkv:snap:{}:{}:{}", key, m->upload, i)});
      redis.command({"DEL", "swarmkv:snap:" + key});
      pub.push_back(p.ms);
      fetch.push_back(f.ms);
      rows.push_back({{"publish_ms", p.ms}, {"fetch_ms", f.ms}});
    }
    const double pm = swarmkv::median(pub), fm = swarmkv::median(fetch);
    const nlohmann::json out = {{"bytes", bytes.size()},
                                {"chunk_bytes", chunk_bytes},
                                {"trials", rows},
                                {"publish_ms_median", pm},
                                {"fetch_ms_median", fm},
                                {"publish_mb_s", bytes.size() / 1000.0 / pm},
                                {"fetch_mb_s", bytes.size() / 1000.0 / fm}};
    std::cout << out.dump(2) << "\n";
  } catch (const swarmkv::Error& e) {
    std::cerr << "swarmkv_bus_bench: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
