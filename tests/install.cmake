# What `cmake --install` and `make package` deliver (cmake/DdplInstall.cmake, DdplPackage.cmake),
# used as a user would: from an installed prefix or an unpacked .deb, never from this tree.

# The Debian package of launch, rdzv-server and the plugin (CPack over this build tree).
add_test(NAME package_test
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/package_test.sh ${CMAKE_BINARY_DIR})
set_tests_properties(package_test PROPERTIES TIMEOUT 180 LABELS "install;integration"
  SKIP_RETURN_CODE 77 COST 60)

# An out-of-tree program (tests/consumer) built with find_package(ddplaunch) against this build
# installed in a temporary prefix, then run on 2 ranks under the installed launch.
if(TARGET ddpl_worker)
  add_test(NAME consumer_test
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/consumer_test.sh ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  set_tests_properties(consumer_test PROPERTIES TIMEOUT 600 LABELS "install;integration" PROCESSORS 2
    COST 100)
endif()
