# Included at the end of tests/CMakeLists.txt.


# Install + outside consumer: `cmake --install` of this build into a scratch
# prefix, then find_package(qgrad) from tests/consumer. Labelled "install"
# so the sanitizer pass of scripts/check.sh can leave it out.
set(QGRAD_CONSUMER_CUDA "")
if(QGRAD_WITH_CUDA)
  set(QGRAD_CONSUMER_CUDA ${CMAKE_CUDA_COMPILER})
endif()
add_test(NAME "install: consumer"
  COMMAND ${CMAKE_COMMAND}
    -DQGRAD_BUILD_DIR=${PROJECT_BINARY_DIR}
    -DCONSUMER_SOURCE=${CMAKE_CURRENT_SOURCE_DIR}/consumer
    -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer-work
    -DGENERATOR=${CMAKE_GENERATOR}
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DCUDA_COMPILER=${QGRAD_CONSUMER_CUDA}
    -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run.cmake)
set_tests_properties("install: consumer" PROPERTIES LABELS install TIMEOUT 600)
