/*
 * A header-only C++ wrapper over libkiln_runtime's C API (kiln/runtime.h): Module, PackedFunc
 * and NDArray own their handles (RAII, movable, copyable by reference count where the C API
 * counts) and throw kiln::Error with TVMGetLastError()'s message. The names follow TVM's C++
 * API (include/tvm/runtime/module.h, packed_func.h, ndarray.h): Module::LoadFromFile,
 * GetFunction, operator[], NDArray::Empty, CopyFromBytes / CopyToBytes. C++11.
 *
 *   kiln::Module factory = kiln::Module::LoadFromFile("model.so");
 *   kiln::Module gm = factory.GetFunction("default")(kiln::cpu()).AsModule();
 *   kiln::NDArray x = kiln::NDArray::Empty({1, 3, 224, 224}, kiln::Float(32));
 *   x.CopyFromBytes(data, nbytes);
 *   gm.GetFunction("set_input")("input", x);
 *   gm.GetFunction("run")();
 *   const DLTensor* y = gm.GetFunction("get_output")(0).AsTensor();
 */
#ifndef KILN_RUNTIME_HPP_
#define KILN_RUNTIME_HPP_

#include <kiln/runtime.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

/* A failed runtime call; what() is the runtime's message. */
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

inline void Check(int rc) {
  if (rc != 0) throw Error(TVMGetLastError());
}

inline DLDevice cpu(int id = 0) { return DLDevice{kDLCPU, id}; }
inline DLDataType Float(int bits) { return DLDataType{kDLFloat, static_cast<uint8_t>(bits), 1}; }
inline DLDataType Int(int bits) { return DLDataType{kDLInt, static_cast<uint8_t>(bits), 1}; }

class Module;

/* A value returned by a PackedFunc call. A module returned is owned by the RetValue until
   AsModule() takes it. */
class RetValue {
 public:
  RetValue() : code_(kTVMNullptr) { value_.v_handle = nullptr; }
  RetValue(TVMValue v, int code) : value_(v), code_(code) {}
  RetValue(const RetValue&) = delete;
  RetValue& operator=(const RetValue&) = delete;
  RetValue(RetValue&& o) noexcept : value_(o.value_), code_(o.code_) { o.code_ = kTVMNullptr; }
  ~RetValue() {
    if (code_ == kTVMModuleHandle) TVMModFree(value_.v_handle);
  }
  int type_code() const { return code_; }
  int64_t AsInt() const { return Expect(kTVMArgInt), value_.v_int64; }
  std::string AsString() const { return Expect(kTVMStr), std::string(value_.v_str); }
  /* kTVMDataType (e.g. get_function_param_dtype's result) */
  DLDataType AsDataType() const { return Expect(kTVMDataType), value_.v_type; }
  /* Borrowed: valid while the module that returned it lives. */
  DLTensor* AsTensor() const {
    if (code_ != kTVMDLTensorHandle && code_ != kTVMNDArrayHandle) Expect(kTVMDLTensorHandle);
    return static_cast<DLTensor*>(value_.v_handle);
  }
  inline Module AsModule();
  /* A tuple (kTVMObjectHandle: a VM function's several results): its size and items
     (borrowed, like the tuple: valid until the VM's next call). */
  int TupleSize() const { return Expect(kTVMObjectHandle), KilnTupleSize(value_.v_handle); }
  RetValue TupleItem(int i) const {
    TVMValue v;
    int code;
    Expect(kTVMObjectHandle);
    Check(KilnTupleGetItem(value_.v_handle, i, &v, &code));
    return RetValue(v, code == kTVMModuleHandle ? kTVMNullptr : code);
  }

 private:
  void Expect(int code) const {
    if (code_ != code)
      throw Error("kiln: return value has type code " + std::to_string(code_) + ", not " +
                  std::to_string(code));
  }
  TVMValue value_;
  int code_;
};

/* The arguments of a call. PackedFunc's operator() builds them; build them yourself when their
   number is known only at run time (a VM function's inputs):
   kiln::Args a; for (auto& x : inputs) a.Add(x); f.CallPacked(a). */
struct Args {
  std::vector<TVMValue> values;
  std::vector<int> codes;
  void Push(TVMValue v, int code) {
    values.push_back(v);
    codes.push_back(code);
  }
  /* Append one argument of any type operator() takes. */
  template <typename T>
  Args& Add(T&& v);
};

/* Argument packing: one overload per supported C++ type. */
namespace detail {
inline void Pack(Args&) {}
template <typename T, typename... Rest>
inline void Pack(Args& a, T&& first, Rest&&... rest);
}  // namespace detail

/* A function of a module, or a global function (reference-counted handle). */
class PackedFunc {
 public:
  PackedFunc() : handle_(nullptr) {}
  explicit PackedFunc(TVMFunctionHandle h) : handle_(h) {}
  PackedFunc(const PackedFunc&) = delete;
  PackedFunc& operator=(const PackedFunc&) = delete;
  PackedFunc(PackedFunc&& o) noexcept : handle_(o.handle_) { o.handle_ = nullptr; }
  PackedFunc& operator=(PackedFunc&& o) noexcept {
    std::swap(handle_, o.handle_);
    return *this;
  }
  ~PackedFunc() {
    if (handle_) TVMFuncFree(handle_);
  }
  explicit operator bool() const { return handle_ != nullptr; }
  TVMFunctionHandle handle() const { return handle_; }

  /* A global function, or an empty PackedFunc when none has that name. */
  static PackedFunc GetGlobal(const std::string& name) {
    TVMFunctionHandle h = nullptr;
    Check(TVMFuncGetGlobal(name.c_str(), &h));
    return PackedFunc(h);
  }

  template <typename... T>
  RetValue operator()(T&&... args) const {
    Args a;
    detail::Pack(a, std::forward<T>(args)...);
    return CallPacked(a);
  }
  /* (`a` is not const: TVMFuncCall takes its arrays as such) */
  RetValue CallPacked(Args& a) const {
    if (!handle_) throw Error("kiln: calling an empty PackedFunc");
    TVMValue ret;
    int code = kTVMNullptr;
    Check(TVMFuncCall(handle_, a.values.data(), a.codes.data(), static_cast<int>(a.codes.size()),
                      &ret, &code));
    return RetValue(ret, code);
  }

 private:
  TVMFunctionHandle handle_;
};

/* A runtime module (reference-counted handle). */
class Module {
 public:
  Module() : handle_(nullptr) {}
  explicit Module(TVMModuleHandle h) : handle_(h) {}
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&& o) noexcept : handle_(o.handle_) { o.handle_ = nullptr; }
  Module& operator=(Module&& o) noexcept {
    std::swap(handle_, o.handle_);
    return *this;
  }
  ~Module() {
    if (handle_) TVMModFree(handle_);
  }
  TVMModuleHandle handle() const { return handle_; }
  std::string type_key() const { return handle_ ? KilnModTypeKey(handle_) : ""; }

  /* Load an exported library (tvm::runtime::Module::LoadFromFile). */
  static Module LoadFromFile(const std::string& path, const std::string& format = "") {
    TVMModuleHandle h = nullptr;
    Check(TVMModLoadFromFile(path.c_str(), format.c_str(), &h));
    return Module(h);
  }
  /* The function `name` (searching the imports), or an empty PackedFunc. */
  PackedFunc GetFunction(const std::string& name, bool query_imports = true) const {
    TVMFunctionHandle h = nullptr;
    Check(TVMModGetFunction(handle_, name.c_str(), query_imports ? 1 : 0, &h));
    return PackedFunc(h);
  }
  /* Like GetFunction, but a missing function is an Error (the runtime's message: the module,
     the name, and how to run a library asked for the other executor's entry point). */
  PackedFunc operator[](const std::string& name) const {
    PackedFunc f = GetFunction(name);
    if (!f) throw Error(std::string("kiln: ") + TVMGetLastError());
    return f;
  }
  void Import(const Module& other) { Check(TVMModImport(handle_, other.handle_)); }

 private:
  TVMModuleHandle handle_;
};

inline Module RetValue::AsModule() {
  Expect(kTVMModuleHandle);
  code_ = kTVMNullptr; /* ownership moves to the Module */
  return Module(value_.v_handle);
}

/* A CPU tensor owning 64-byte aligned memory (TVMArrayAlloc). */
class NDArray {
 public:
  NDArray() : t_(nullptr) {}
  NDArray(const NDArray&) = delete;
  NDArray& operator=(const NDArray&) = delete;
  NDArray(NDArray&& o) noexcept : t_(o.t_) { o.t_ = nullptr; }
  NDArray& operator=(NDArray&& o) noexcept {
    std::swap(t_, o.t_);
    return *this;
  }
  ~NDArray() {
    if (t_) TVMArrayFree(t_);
  }
  static NDArray Empty(std::vector<int64_t> shape, DLDataType dtype, DLDevice dev = cpu()) {
    NDArray a;
    Check(TVMArrayAlloc(shape.data(), static_cast<int>(shape.size()), dtype.code, dtype.bits,
                        dtype.lanes, dev.device_type, dev.device_id, &a.t_));
    return a;
  }
  void CopyFromBytes(const void* data, size_t nbytes) {
    Check(TVMArrayCopyFromBytes(t_, const_cast<void*>(data), nbytes));
  }
  void CopyToBytes(void* data, size_t nbytes) const { Check(TVMArrayCopyToBytes(t_, data, nbytes)); }
  /* Copy another tensor's bytes (same size) into this one. */
  void CopyFrom(const DLTensor* src) {
    CopyFromBytes(static_cast<const char*>(src->data) + src->byte_offset, KilnArrayNumBytes(src));
  }
  size_t NumBytes() const { return KilnArrayNumBytes(t_); }
  DLTensor* operator->() const { return t_; }
  DLTensor* get() const { return t_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(t_->data);
  }

 private:
  DLTensor* t_;
};

namespace detail {
inline void Put(Args& a, int v) { TVMValue x; x.v_int64 = v; a.Push(x, kTVMArgInt); }
inline void Put(Args& a, int64_t v) { TVMValue x; x.v_int64 = v; a.Push(x, kTVMArgInt); }
inline void Put(Args& a, double v) { TVMValue x; x.v_float64 = v; a.Push(x, kTVMArgFloat); }
inline void Put(Args& a, const char* v) { TVMValue x; x.v_str = v; a.Push(x, kTVMStr); }
inline void Put(Args& a, const std::string& v) { Put(a, v.c_str()); }
inline void Put(Args& a, DLDevice v) { TVMValue x; x.v_device = v; a.Push(x, kDLDeviceArg); }
inline void Put(Args& a, DLTensor* v) { TVMValue x; x.v_handle = v; a.Push(x, kTVMDLTensorHandle); }
inline void Put(Args& a, const DLTensor* v) { Put(a, const_cast<DLTensor*>(v)); }
inline void Put(Args& a, const NDArray& v) { Put(a, v.get()); }
inline void Put(Args& a, const Module& v) { TVMValue x; x.v_handle = v.handle(); a.Push(x, kTVMModuleHandle); }
/* bytes (load_params): pass a TVMByteArray* */
inline void Put(Args& a, const TVMByteArray* v) {
  TVMValue x;
  x.v_handle = const_cast<TVMByteArray*>(v);
  a.Push(x, kTVMBytes);
}
template <typename T, typename... Rest>
inline void Pack(Args& a, T&& first, Rest&&... rest) {
  Put(a, std::forward<T>(first));
  Pack(a, std::forward<Rest>(rest)...);
}
}  // namespace detail

template <typename T>
inline Args& Args::Add(T&& v) {
  detail::Put(*this, std::forward<T>(v));
  return *this;
}

}  // namespace kiln

#endif /* KILN_RUNTIME_HPP_ */
