# Writes OUT: template.py (IN) as the body of ddpl::launcher::warm::templateSource(), so that the
# template's program travels inside launch (a wheel, a .deb, a bare GPU host: no file to find).
file(READ "${IN}" source)
string(FIND "${source}" ")ddpl_template\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} holds the raw string's delimiter")
endif()
file(WRITE "${OUT}.tmp" "// Generated from launcher/warm/template.py by embed_template.cmake.\n"
  "namespace ddpl::launcher::warm {\n"
  "const char* templateSource() {\n  return R\"ddpl_template(${source})ddpl_template\";\n}\n"
  "}  // namespace ddpl::launcher::warm\n")
configure_file("${OUT}.tmp" "${OUT}" COPYONLY)  # rewritten only when it changed
file(REMOVE "${OUT}.tmp")
