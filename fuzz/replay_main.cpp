// Replays a libFuzzer corpus through a fuzz target without libFuzzer, so every normal test run
// exercises the checked-in corpus (and any crash reproducer added to it).
// Usage: replay_<target> <file-or-directory>...
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size);

namespace {

int run_file(std::filesystem::path const& p) {
  std::ifstream in{p, std::ios::binary};
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", p.c_str());
    return 1;
  }
  std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>{in},
                                  std::istreambuf_iterator<char>{}};
  // A null data pointer for empty input mirrors what libFuzzer may pass.
  (void)LLVMFuzzerTestOneInput(bytes.empty() ? nullptr : bytes.data(), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <corpus file or directory>...\n", argv[0]);
    return 2;
  }
  std::size_t files = 0;
  int failures = 0;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path const arg{argv[i]};
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      for (auto const& e : std::filesystem::recursive_directory_iterator{arg}) {
        if (!e.is_regular_file()) continue;
        failures += run_file(e.path());
        ++files;
      }
    } else {
      failures += run_file(arg);
      ++files;
    }
  }
  std::printf("replayed %zu inputs\n", files);
  // An empty corpus is a broken test setup, not a pass.
  return failures != 0 || files == 0 ? 1 : 0;
}
