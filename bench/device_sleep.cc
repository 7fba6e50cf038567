// A stand-in for a GPU kernel on JAX's CPU backend: an XLA FFI call that sleeps `ms` milliseconds on XLA's
// own thread (no CPU spent, the interpreter's lock never taken) and copies its input to its output.
// Built and registered by bench/device_sleep.py.
#include <chrono>
#include <cstddef>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static ffi::Error SleepImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y, float ms) {
  std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(ms * 1000.0f)));
  const std::size_t n = x.element_count();
  for (std::size_t i = 0; i < n; ++i) y->typed_data()[i] = x.typed_data()[i];
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuidleBenchSleep, SleepImpl,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>().Attr<float>("ms"));
