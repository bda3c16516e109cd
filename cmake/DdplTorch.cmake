# LibTorch as one INTERFACE target, for our build (ddpl_torch, worker/CMakeLists.txt) and for
# programs built against an installed ddplaunch (ddplaunch::torch, ddplaunchConfig.cmake): one
# definition, so that a consumer compiles and links exactly as our own tests do.
#
# Why not torch's own `torch` CMake target: its interface drags in the CUDA toolkit found on
# the machine (CUDA 13 here) while the pip wheel's libtorch_cuda.so is built against the cu12
# runtime shipped in nvidia-* wheels; two libcudart in one process is a crash waiting for a GPU.
# These targets name the wheel's own libraries, whose RUNPATH finds the matching runtime.
#
# ddpl_torch_cxx_runtime(<torch dir> <out var>): the shared C++ runtime LibTorch runs on
# (libstdc++.so.6 and libgcc_s.so.1, as the loader resolves them for libc10.so), to be named on
# the link line of every program that links LibTorch.
#
# Why: a program linked with the toolchain's static runtime (`-static-libstdc++`, or a
# compiler whose libstdc++ exists only as libstdc++.a: the lent GPU host's GCC 13 at /opt/gcc)
# carries a second copy of the C++ runtime beside the libstdc++.so.6 that LibTorch loads: two
# exception-handling runtimes, two sets of type_info, and, with the worker's throw-site capture
# (worker/throw_stack.cc defines __cxa_allocate_exception), a link failure ("multiple definition
# of `__cxa_allocate_exception`", libstdc++.a(eh_alloc.o)). Named first, the shared runtime
# satisfies every C++ runtime symbol, so the linker pulls nothing from libstdc++.a even where
# the driver adds it (`-Bstatic -lstdc++`), and the program has one runtime: LibTorch's.
# Interposing __cxa_allocate_exception then works as with any shared runtime.
function(ddpl_torch_cxx_runtime dir out)
  set(libs "")
  find_program(DDPL_LDD ldd)
  if(DDPL_LDD AND EXISTS "${dir}/lib/libc10.so")
    execute_process(COMMAND "${DDPL_LDD}" "${dir}/lib/libc10.so" OUTPUT_VARIABLE deps
                    ERROR_QUIET RESULT_VARIABLE rc)
    foreach(soname libstdc++.so.6 libgcc_s.so.1)
      string(REPLACE "+" "\\+" pattern "${soname}")
      if(rc EQUAL 0 AND deps MATCHES "${pattern} => ([^ \n]+)")
        list(APPEND libs "${CMAKE_MATCH_1}")
      endif()
    endforeach()
  endif()
  if(NOT libs)
    # No ldd (or it failed): where the loader looks first on the usual layouts.
    find_file(DDPL_SHARED_LIBSTDCXX NAMES libstdc++.so.6
      PATHS /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib/aarch64-linux-gnu
            /usr/lib/aarch64-linux-gnu /usr/lib64 /lib64 /usr/lib NO_DEFAULT_PATH)
    if(DDPL_SHARED_LIBSTDCXX)
      list(APPEND libs "${DDPL_SHARED_LIBSTDCXX}")
    endif()
  endif()
  if(NOT libs)
    message(WARNING "LibTorch's shared libstdc++.so.6 not found (no ldd, none in the system's "
      "library directories): programs linking LibTorch use the toolchain's own C++ runtime, "
      "which must then be the shared one")
  endif()
  set(${out} "${libs}" PARENT_SCOPE)
endfunction()

# ddpl_torch_cxx_standard(<torch dir> <out var>): the C++ standard LibTorch's headers require,
# read from the check they make (torch/all.h: C++17 up to torch 2.14, C++20 from 2.15), so that
# the build follows the LibTorch it found instead of the user choosing. The project itself stays
# C++17; only targets that link LibTorch compile under a newer standard when it asks for one.
function(ddpl_torch_cxx_standard dir out)
  set(standard 17)
  set(header "${dir}/include/torch/csrc/api/include/torch/all.h")
  if(EXISTS "${header}")
    file(READ "${header}" text)
    if(text MATCHES "__cplusplus < (20[0-9][0-9])[0-9][0-9]L")
      # 2017 -> 17 (201703L), 2020 -> 20 (202002L), 2023 -> 23 (202302L): the year's last two
      # digits, where the check names the value of the standard it requires.
      math(EXPR standard "${CMAKE_MATCH_1} % 100")
    endif()
  endif()
  set(${out} "${standard}" PARENT_SCOPE)
endfunction()

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
  ddpl_torch_cxx_standard("${dir}" standard)
  target_compile_features(${name} INTERFACE cxx_std_${standard})
  # One C++ runtime in the process: LibTorch's (ddpl_torch_cxx_runtime below), named before
  # anything else that could bring one.
  ddpl_torch_cxx_runtime("${dir}" runtime)
  target_link_libraries(${name} INTERFACE ${runtime}
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
