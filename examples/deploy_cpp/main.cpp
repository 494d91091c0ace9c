// Run a Kiln model from C++ with libkiln_runtime's header-only wrapper (kiln/runtime.hpp): load
// model.so, feed its first input from a raw file, run, write its first output and print the
// best class.
//
//     ./deploy_cpp model.so input.bin output.bin
#include <kiln/runtime.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " model.so input.bin output.bin\n";
    return 2;
  }
  try {
    kiln::Module factory = kiln::Module::LoadFromFile(argv[1]);
    kiln::Module gm = factory["default"](kiln::cpu()).AsModule();

    const DLTensor* in = gm["get_input"](0).AsTensor();  // shape and dtype of input 0
    kiln::NDArray x = kiln::NDArray::Empty(
        std::vector<int64_t>(in->shape, in->shape + in->ndim), in->dtype);
    std::ifstream file(argv[2], std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
    x.CopyFromBytes(bytes.data(), bytes.size());  // throws when the size differs

    gm["set_input"](0, x);
    gm["run"]();
    const DLTensor* y = gm["get_output"](0).AsTensor();  // borrowed from the executor
    size_t n = KilnArrayNumBytes(y);
    std::ofstream(argv[3], std::ios::binary).write(static_cast<const char*>(y->data), n);
    if (y->dtype.code == kDLFloat && y->dtype.bits == 32) {
      const float* p = static_cast<const float*>(y->data);
      size_t best = 0;
      for (size_t i = 1; i < n / 4; ++i)
        if (p[i] > p[best]) best = i;
      std::cout << "best class: " << best << " (score " << p[best] << ")\n";
    }
  } catch (const kiln::Error& e) {
    std::cerr << "kiln error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
