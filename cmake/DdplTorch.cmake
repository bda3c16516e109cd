# LibTorch as one INTERFACE target, for our build (ddpl_torch, worker/CMakeLists.txt) and for
# programs built against an installed ddplaunch (ddplaunch::torch, ddplaunchConfig.cmake): one
# definition, so that a consumer compiles and links exactly as our own tests do.
#
# Why not torch's own `torch` CMake target: its interface drags in the CUDA toolkit found on
# the machine (CUDA 13 here) while the pip wheel's libtorch_cuda.so is built against the cu12
# runtime shipped in nvidia-* wheels; two libcudart in one process is a crash waiting for a GPU.
# These targets name the wheel's own libraries, whose RUNPATH finds the matching runtime.
#
# ddpl_torch_target(<name> <torch dir> [IMPORTED] [CUDA])
#   <torch dir>  the torch package directory (TORCH_INSTALL_PREFIX: .../site-packages/torch)
#   CUDA         also link libtorch_cuda and libc10_cuda (the NCCL backend lives there)
function(ddpl_torch_target name dir)
  cmake_parse_arguments(T "IMPORTED;CUDA" "" "" ${ARGN})
  if(T_IMPORTED)
    add_library(${name} INTERFACE IMPORTED)
  else()
    add_library(${name} INTERFACE)
  endif()
  target_include_directories(${name} SYSTEM INTERFACE
    "${dir}/include" "${dir}/include/torch/csrc/api/include")
  # The wheel is built with the C++11 ABI; Gloo's backend is declared only under USE_C10D_GLOO.
  target_compile_definitions(${name} INTERFACE _GLIBCXX_USE_CXX11_ABI=1 USE_C10D_GLOO)
  target_compile_features(${name} INTERFACE cxx_std_17)
  target_link_libraries(${name} INTERFACE
    "${dir}/lib/libtorch.so" "${dir}/lib/libtorch_cpu.so" "${dir}/lib/libc10.so")
  if(T_CUDA)
    # --no-as-needed: libtorch_cuda registers the CUDA hooks from static initialisers; without
    # it loaded, torch::cuda::is_available() is false even on a GPU machine.
    target_link_libraries(${name} INTERFACE
      "-Wl,--no-as-needed" "${dir}/lib/libtorch_cuda.so" "${dir}/lib/libc10_cuda.so" "-Wl,--as-needed")
  endif()
endfunction()

# ddpl_torch_version(<torch dir> <out var>): "MAJOR.MINOR.PATCH" from the C++ headers, or "" when
# <torch dir> holds no LibTorch. The worker's static archives contain LibTorch's inline code,
# so a consumer must link the version they were compiled against.
function(ddpl_torch_version dir out)
  set(header "${dir}/include/torch/csrc/api/include/torch/version.h")
  set(version "")
  if(EXISTS "${header}")
    file(STRINGS "${header}" lines REGEX "^#define TORCH_VERSION_(MAJOR|MINOR|PATCH) [0-9]+")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX MATCH "TORCH_VERSION_${part} ([0-9]+)" _ "${lines}")
      list(APPEND version "${CMAKE_MATCH_1}")
    endforeach()
    list(JOIN version "." version)
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()
