# Writes OUT: page.html (IN) as ddpl::web::kDashboardPage, so that the dashboard's page
# travels inside launch's plugin (a cluster with no internet, a wheel: no file to find).
file(READ "${IN}" source)
string(FIND "${source}" ")ddpl_page\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} holds the raw string's delimiter")
endif()
file(WRITE "${OUT}.tmp" "// Generated from web/page.html by embed_page.cmake.\n"
  "#include \"web/dashboard.h\"\n"
  "namespace ddpl::web {\n"
  "const char* const kDashboardPage = R\"ddpl_page(${source})ddpl_page\";\n"
  "}  // namespace ddpl::web\n")
configure_file("${OUT}.tmp" "${OUT}" COPYONLY)  # rewritten only when it changed
file(REMOVE "${OUT}.tmp")
