# `make package` (scripts/package.sh): a Debian package of the runtime component only: launch,
# rdzv-server and the gRPC plugin, under /usr. No LibTorch inside (launch never links it).
#
# The worker library is not packaged: its archives hold LibTorch's inline code and link only
# against the exact torch they were compiled with, which comes from pip, not from Debian, so a
# .deb could name no dependency that guarantees it. Users build it from source and
# `cmake --install` it (docs/worker.md).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddplaunch)
set(CPACK_PACKAGE_CONTACT "ddplaunch maintainers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "native torchrun-compatible launcher and rendezvous server for distributed PyTorch")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "launch starts and supervises the workers of a distributed PyTorch job with torchrun's\n\
flags and environment; rdzv-server runs the gRPC rendezvous and key-value store that\n\
several nodes meet at. Neither links LibTorch: launch runs any program, with any torch.")
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ddplaunch)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# Depends from the ELF files themselves (libgrpc++, libprotobuf, libspdlog, libfmt...), so the
# list follows whatever the binaries really link.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_STRIP_FILES ON)
include(CPack)
