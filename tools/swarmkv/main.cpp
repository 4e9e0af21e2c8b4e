// swarmkv: the command-line front end of the SwarmKV library.
#include "cli.h"

int main(int argc, char** argv) {
  return swarmkv::cli::run(argc, argv);
}
