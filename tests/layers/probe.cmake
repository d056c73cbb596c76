# cmake -P script behind the ctest test `layers: a back edge fails to build`.
# Compiles and links two probes into the core layer with the exact command
# line the build uses for core/tensor.cpp (from compile_commands.json):
#  1. a core source that includes an ops header must not compile;
#  2. a core object that calls Tensor::reshape (defined in ops/) must not link
#     into the layer check's --no-undefined shared object.
# A control compile of a core-only probe must pass, so the probes fail for
# the reason they test and not for a broken command line.
# Inputs: BUILD_DIR, PROBE_DIR, CXX_COMPILER.
file(READ ${BUILD_DIR}/compile_commands.json db)
string(JSON n LENGTH "${db}")
math(EXPR last "${n} - 1")
set(cmd "")
foreach(i RANGE ${last})
  string(JSON file GET "${db}" ${i} file)
  if(file MATCHES "/core/tensor\\.cpp$")
    string(JSON cmd GET "${db}" ${i} command)
    string(JSON dir GET "${db}" ${i} directory)
  endif()
endforeach()
if(cmd STREQUAL "")
  message(FATAL_ERROR "layers: core/tensor.cpp not found in compile_commands.json")
endif()
separate_arguments(args UNIX_COMMAND "${cmd}")
# Drop the launcher, compiler, source, output and dependency-file arguments; keep flags.
set(flags "")
set(skip FALSE)
foreach(a ${args})
  if(skip)
    set(skip FALSE)
  elseif(a STREQUAL "-o" OR a STREQUAL "-MF" OR a STREQUAL "-MT" OR a STREQUAL "-c")
    set(skip TRUE)
  elseif(a MATCHES "^-[IDfWOmsgx]|^-std=|^-isystem")
    list(APPEND flags "${a}")
  endif()
endforeach()
set(work ${BUILD_DIR}/tests/layers-work)
file(MAKE_DIRECTORY ${work})

function(compile src obj expect_ok what)
  execute_process(COMMAND ${CXX_COMPILER} ${flags} -c ${PROBE_DIR}/${src} -o ${work}/${obj}
                  WORKING_DIRECTORY ${dir} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "layers: ${what} failed to compile:\n${err}")
  elseif(NOT expect_ok AND rc EQUAL 0)
    message(FATAL_ERROR "layers: ${what} compiled, but the include goes against the layer order")
  endif()
  set(compile_err "${err}" PARENT_SCOPE)
endfunction()

compile(core_only.cpp core_only.o TRUE "the control probe (core headers only)")
compile(include_ops.cpp include_ops.o FALSE "the include probe")
if(NOT compile_err MATCHES "qgrad/ops/ops.h")
  message(FATAL_ERROR "layers: the include probe failed for another reason:\n${compile_err}")
endif()
message(STATUS "layers: core cannot include an ops header (as intended)")

compile(call_reshape.cpp call_reshape.o TRUE "the call probe")
execute_process(COMMAND ${CXX_COMPILER} -shared -Wl,--no-undefined -o ${work}/probe.so ${work}/call_reshape.o
                -Wl,--whole-archive ${BUILD_DIR}/libqgrad_core.a -Wl,--no-whole-archive -lpthread
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "layers: core linked with a call into ops (Tensor::reshape): the layer check would miss it")
endif()
if(NOT err MATCHES "undefined reference to .*reshape")
  message(FATAL_ERROR "layers: the call probe failed to link for another reason:\n${err}")
endif()
message(STATUS "layers: a call from core into ops fails to link (as intended)")
file(REMOVE_RECURSE ${work})
