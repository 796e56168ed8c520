# dtrain_add_library(NAME layer SOURCES ... DEPS ...): one static library per layer (DESIGN.md §1).
function(dtrain_add_library layer)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  if(NOT ARG_SOURCES)
    # A layer with no sources yet is a header-only interface target.
    add_library(dtrain_${layer} INTERFACE)
    target_include_directories(dtrain_${layer} INTERFACE ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(dtrain_${layer} INTERFACE ${ARG_DEPS})
    return()
  endif()
  add_library(dtrain_${layer} STATIC ${ARG_SOURCES})
  target_include_directories(dtrain_${layer}
    PUBLIC ${PROJECT_SOURCE_DIR}/include
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(dtrain_${layer} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
endfunction()

# dtrain_add_test(SRC file LIBS ... LABELS ... [TIMEOUT s] [PER_TEST]): one test executable per
# test file, one ctest test for it; with PER_TEST, one ctest test per gtest test in it (named
# <target>.<Suite>.<Test>, listed when the executable is built), each with its own TIMEOUT: for
# files whose tests each run a whole job, so that a loaded machine slows each one within its own
# budget and ctest -j can run them side by side.
function(dtrain_add_test src)
  cmake_parse_arguments(ARG "PER_TEST" "TIMEOUT" "LIBS;LABELS" ${ARGN})
  get_filename_component(name ${src} NAME_WE)
  get_filename_component(dir ${src} DIRECTORY)
  get_filename_component(layer ${dir} NAME)
  set(target ${layer}_${name})
  add_executable(${target} ${src})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${target} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${target} PRIVATE
    DTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    DTRAIN_BINARY_DIR="${PROJECT_BINARY_DIR}")
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(ARG_PER_TEST)
    include(GoogleTest)
    gtest_discover_tests(${target} TEST_PREFIX "${target}." WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
      PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} DISCOVERY_TIMEOUT 60)
    return()
  endif()
  add_test(NAME ${target} COMMAND ${target} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(${target} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()
