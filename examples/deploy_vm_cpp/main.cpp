// Run a Kiln VM library (a model with symbolic dims, e.g. a dynamic batch) from C++ with
// libkiln_runtime's header-only wrapper (kiln/runtime.hpp): load model.so, create a VM on the
// CPU, build main's inputs at the shapes given on the command line from raw files, call main,
// print its outputs and write each to OUT<k>.bin.
//
//     ./deploy_vm_cpp model.so OUT SHAPE:FILE...     one per input of main, in its order
//     ./deploy_vm_cpp model.so out 2x3x224x224:x.bin
#include <kiln/runtime.hpp>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

// "2x3x224x224:x.bin" -> {2, 3, 224, 224} and "x.bin"; false when malformed.
static bool ParseInput(const std::string& arg, std::vector<int64_t>* dims, std::string* file) {
  size_t colon = arg.find(':');
  if (colon == std::string::npos || colon + 1 == arg.size()) return false;
  std::istringstream shape(arg.substr(0, colon));
  std::string dim;
  while (std::getline(shape, dim, 'x')) {
    char* end;
    long long d = std::strtoll(dim.c_str(), &end, 10);
    if (dim.empty() || *end != '\0' || d < 0) return false;
    dims->push_back(d);
  }
  *file = arg.substr(colon + 1);
  return !dims->empty();
}

static std::string DTypeName(DLDataType t) {
  const char* kind = t.code == kDLFloat ? "float" : t.code == kDLInt ? "int" : "uint";
  return kind + std::to_string(t.bits);
}

// Print output k (dtype, shape; float32: each row's first values and its best index) and write
// its bytes to <prefix><k>.bin.
static void PrintOutput(int k, const DLTensor* y, const std::string& prefix) {
  size_t nbytes = KilnArrayNumBytes(y);
  std::cout << "output " << k << ": " << DTypeName(y->dtype) << " [";
  for (int d = 0; d < y->ndim; ++d) std::cout << (d ? ", " : "") << y->shape[d];
  std::cout << "]\n";
  if (y->dtype.code == kDLFloat && y->dtype.bits == 32 && y->ndim > 0 && nbytes > 0) {
    size_t rows = static_cast<size_t>(y->shape[0]), cols = nbytes / 4 / rows;
    const float* p = static_cast<const float*>(y->data);
    for (size_t row = 0; row < rows; ++row, p += cols) {
      size_t best = 0;
      std::cout << "  row " << row << ":";
      for (size_t i = 0; i < cols; ++i) {
        if (i < 8) std::cout << " " << p[i];
        if (p[i] > p[best]) best = i;
      }
      std::cout << (cols > 8 ? " ..." : "") << " (best " << best << ")\n";
    }
  }
  std::string path = prefix + std::to_string(k) + ".bin";
  if (!std::ofstream(path, std::ios::binary).write(static_cast<const char*>(y->data), nbytes))
    throw kiln::Error("cannot write " + path);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: " << argv[0] << " model.so OUT SHAPE:FILE...  (e.g. 2x3x224x224:x.bin)\n";
    return 2;
  }
  try {
    // the root module is the VM executable; a VM on the CPU (device type, id, pooled allocator)
    kiln::Module exe = kiln::Module::LoadFromFile(argv[1]);
    kiln::Module vm = exe["vm_load_executable"]().AsModule();
    vm["vm_initialization"](int64_t(kDLCPU), int64_t(0), int64_t(2));

    // main's signature: how many inputs, and each one's dtype
    int n = static_cast<int>(vm["get_function_arity"]("main").AsInt());
    if (argc - 3 != n) {
      std::cerr << "main takes " << n << " inputs; give SHAPE:FILE for each:";
      for (int k = 0; k < n; ++k)
        std::cerr << " " << vm["get_function_param_name"]("main", k).AsString();
      std::cerr << "\n";
      return 2;
    }
    // the inputs, at the shapes the command line gives (the VM checks them against the model's
    // symbols), with main's dtypes
    std::vector<kiln::NDArray> inputs;
    kiln::Args args;
    for (int k = 0; k < n; ++k) {
      std::vector<int64_t> dims;
      std::string file;
      if (!ParseInput(argv[3 + k], &dims, &file)) {
        std::cerr << "input " << k << ": expected SHAPE:FILE such as 2x3x224x224:x.bin, got "
                  << argv[3 + k] << "\n";
        return 2;
      }
      DLDataType dtype = vm["get_function_param_dtype"]("main", k).AsDataType();
      inputs.push_back(kiln::NDArray::Empty(dims, dtype));
      std::ifstream in(file, std::ios::binary);
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      inputs.back().CopyFromBytes(bytes.data(), bytes.size());  // throws when the size differs
      args.Add(inputs.back());
    }
    // main(inputs...): one tensor, or a tuple of them; owned by the VM until its next call
    kiln::PackedFunc main_fn = vm["main"];
    kiln::RetValue r = main_fn.CallPacked(args);
    if (r.type_code() == kTVMObjectHandle) {
      for (int k = 0; k < r.TupleSize(); ++k) PrintOutput(k, r.TupleItem(k).AsTensor(), argv[2]);
    } else {
      PrintOutput(0, r.AsTensor(), argv[2]);
    }
  } catch (const kiln::Error& e) {
    std::cerr << "kiln error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
