# Resume bit for bit (issue #17 item 6), on DEVICE (default cpu): runs
# qgrad-qat-mlp on 1200 training / 500 test images (2 float + 2 QAT epochs
# of 12 steps: float steps 1-24, QAT steps 25-48) and checks that runs
# killed with SIGKILL (the hidden --abort-at-step N kills the process
# during step N, between backward and the optimizer step) and continued
# with --resume end with the same report.json (timing removed), metrics.csv
# (seconds removed) and bit-identical float/qat/int8 checkpoints as an
# uninterrupted run without checkpoints:
#   A: killed in the float phase; before resuming, a truncated temporary
#      checkpoint file is left in the folder, as a kill during the atomic
#      write leaves one: --resume must ignore it (and the next save remove it);
#   B: killed in the float phase, resumed and killed again in the QAT phase,
#      resumed again.
# The kill steps are drawn from SEED (printed). Also: --resume without a
# checkpoint and with a different --lr fail with a clear message.
# With RUN (qgrad-run) and NPROC, every run is distributed over NPROC Gloo
# ranks (per-rank --batch BATCH, the global batch BATCH x NPROC): the killed
# runs are SIGKILLed on every rank at the same step, and rank 0's files are
# compared with an uninterrupted distributed run.
set(data /usr/share/datasets/fashion-mnist)
if(NOT EXISTS ${data}/train-images-idx3-ubyte.gz)
  message("SKIPPED: Fashion-MNIST is not installed at ${data}")
  return()
endif()
if(NOT DEVICE)
  set(DEVICE cpu)
endif()
if(NOT SEED)
  set(SEED 17)
endif()
if(NOT DEVICE STREQUAL "cpu")
  execute_process(COMMAND ${EXE} --probe-cuda RESULT_VARIABLE has_cuda)
  if(NOT has_cuda EQUAL 0)
    message("SKIPPED: no CUDA device present; this test needs a GPU")
    return()
  endif()
endif()
file(REMOVE_RECURSE ${OUT})
set(every 5)
if(NOT BATCH)
  set(BATCH 100)
endif()
set(launch "")
if(RUN)
  set(launch ${RUN} --nproc-per-node ${NPROC})
endif()
set(common --epochs 2 --qat-epochs 2 --batch ${BATCH} --limit-train 1200 --limit-test 500 --seed 5 --device ${DEVICE}
           --data ${data} --plot-format svg)

# Kill steps from SEED: float in [6, 24] (after the first checkpoint at step 5), QAT in [25, 48].
function(draw var lo hi salt)
  math(EXPR rs "${SEED} * 1000 + ${salt}")
  string(RANDOM LENGTH 6 ALPHABET 0123456789 RANDOM_SEED ${rs} r)
  string(REGEX REPLACE "^0+" "" r "${r}0")
  math(EXPR v "${lo} + (${r} % (${hi} - ${lo} + 1))")
  set(${var} ${v} PARENT_SCOPE)
endfunction()
draw(kill_a 6 24 1)
draw(kill_b1 6 24 2)
draw(kill_b2 25 48 3)
message("seed ${SEED}: A killed at step ${kill_a} (float); B killed at ${kill_b1} (float), then at ${kill_b2} (QAT)")

function(run_exe name expect)  # expect: ok or killed
  execute_process(COMMAND ${launch} ${EXE} ${common} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
  if(expect STREQUAL "ok" AND NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${log}")
  endif()
  # (Distributed, the first rank to die makes qgrad-run stop the others and say so.)
  if(expect STREQUAL "killed" AND (rc EQUAL 0 OR NOT log MATCHES "SIGKILL during the step|exited with code 137"))
    message(FATAL_ERROR "${name} was not killed (${rc}):\n${log}")
  endif()
  message("${name}: ${rc}")
endfunction()

# report.json without "timing", metrics.csv without its seconds column.
function(outputs dir var)
  file(READ ${dir}/report.json json)
  string(JSON json REMOVE "${json}" timing)
  file(READ ${dir}/metrics.csv csv)
  string(REGEX REPLACE ",[^,\n]*\n" "\n" csv "${csv}")
  set(${var} "${json}\n${csv}" PARENT_SCOPE)
endfunction()

function(same_as_reference dir)
  outputs(${OUT}/ref ref)
  outputs(${dir} got)
  if(NOT ref STREQUAL got)
    message(FATAL_ERROR "${dir}: report.json/metrics.csv differ from the uninterrupted run:\n${ref}\n---\n${got}")
  endif()
  foreach(f float.safetensors qat.safetensors int8.safetensors)
    execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${OUT}/ref/${f} ${dir}/${f} RESULT_VARIABLE differ)
    if(NOT differ EQUAL 0)
      message(FATAL_ERROR "${dir}: ${f} differs from the uninterrupted run")
    endif()
  endforeach()
endfunction()

run_exe("uninterrupted" ok --out ${OUT}/ref)

# A: float-phase kill, a torn temporary checkpoint left behind, resume.
run_exe("A: run killed at ${kill_a}" killed --out ${OUT}/a --checkpoint-every ${every} --abort-at-step ${kill_a})
if(EXISTS ${OUT}/a/report.json)
  message(FATAL_ERROR "A: the killed run wrote report.json")
endif()
# A kill during the atomic write leaves a truncated temporary file named
# after the dead writer's pid (999999999 exceeds pid_max: that process is gone).
set(torn ${OUT}/a/.train_state.safetensors.tmp.999999999.AbC123)
execute_process(COMMAND head -c 3000 ${OUT}/a/train_state.safetensors OUTPUT_FILE ${torn} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS ${torn})
  message(FATAL_ERROR "A: cannot write the truncated temporary checkpoint")
endif()
run_exe("A: resumed" ok --out ${OUT}/a --checkpoint-every ${every} --resume)
same_as_reference(${OUT}/a)
if(EXISTS ${torn})
  message(FATAL_ERROR "A: the torn temporary checkpoint was not removed by the next save")
endif()

# B: float-phase kill, resume killed in the QAT phase, resume again.
run_exe("B: run killed at ${kill_b1}" killed --out ${OUT}/b --checkpoint-every ${every} --abort-at-step ${kill_b1})
run_exe("B: resumed, killed at ${kill_b2}" killed --out ${OUT}/b --checkpoint-every ${every} --resume
        --abort-at-step ${kill_b2})
run_exe("B: resumed again" ok --out ${OUT}/b --checkpoint-every ${every} --resume)
same_as_reference(${OUT}/b)

# Errors: no checkpoint; a different hyper-parameter.
execute_process(COMMAND ${launch} ${EXE} ${common} --out ${OUT}/empty --resume RESULT_VARIABLE rc OUTPUT_VARIABLE log
                ERROR_VARIABLE log)
if(rc EQUAL 0 OR NOT log MATCHES "--resume: no checkpoint to resume from")
  message(FATAL_ERROR "--resume without a checkpoint: expected a clear error (${rc}):\n${log}")
endif()
execute_process(COMMAND ${launch} ${EXE} ${common} --out ${OUT}/b --resume --lr 0.1 RESULT_VARIABLE rc OUTPUT_VARIABLE log
                ERROR_VARIABLE log)
if(rc EQUAL 0 OR NOT log MATCHES "--resume: --lr is 0.1 here but 0.05 in the checkpoint")
  message(FATAL_ERROR "--resume with another --lr: expected an error naming --lr (${rc}):\n${log}")
endif()
message("qat_mlp resume: runs killed at steps ${kill_a}; ${kill_b1} then ${kill_b2} and resumed end with report.json, metrics.csv and float/qat/int8 checkpoints identical to the uninterrupted run")
