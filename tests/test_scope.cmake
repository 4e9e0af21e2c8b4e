# Which tests each preset leaves out, and why: the one place that decides it.
#
# CTest includes this file after the test binaries are discovered (tests/CMakeLists.txt writes a
# one-line include that sets _swarmkv_sanitize to the build's SWARMKV_SANITIZE first). A test left
# out is DISABLED: ctest lists it as "Not Run (Disabled)" and it costs nothing, where a GTEST_SKIP
# still starts the process and loads the model (0.5 s under ASan, 1.7 s under TSan). Every test
# here runs in the release preset, apart from those its own list (the last) names.
#
# Patterns are regular expressions over the gtest cases' CTest names ("Suite.Name", with
# "Prefix/" and "/model" around the parameterised ones). The scripted tests (cluster.*,
# hardening.*) are chosen per preset where tests/CMakeLists.txt registers them.

# ASan/UBSan look for memory errors and undefined behaviour in our code. Left out: tests whose
# code paths other tests take under ASan, and which add numerics (equal bits, bounds) to them.
set(_swarmkv_not_under_asan
    # equal bits or bounds between runs of the same paths: the release preset's job
    "ExactForkTest\\.(SharedAndHostEqualRecomputeOnALongDocument|SharedEqualsHostWithMoreLiveBranchesThanOneMicroBatch)"
    "ExactForkTest\\.LogprobsAreTheSameUnderEveryForkAndThroughTheResultJson"
    "ForkEquivalenceTest\\.(HostForkEqualsRecomputeUnderEveryEngineSetting|SharedForkWithOneAgentEqualsRecomputeExactly)"
    "InexactForkTest\\.SharedForkEqualsRecomputeUpToMeasuredNearTies"
    "CorpusModelTest\\.EachDocumentEqualsItsOwnReprefillAndReduceAgentsSeeEveryAnswerInOrder"
    "SnapshotModelTest\\.(AStreamedPrefillPublishesAPlainPrefillsStateForTheNextRun|AppendedDocumentReusesTheCommonPrefixAndAnswersAsACold)"
    "EngineModelTest\\.(PrefillChunkSizeDoesNotChangeNextTokenOrLogits|GreedyGenerationOfAtLeast32TokensIsIdenticalAcrossRuns|SampledGenerationIsReproducibleForAFixedSeed)"
    "EngineModelForkTest\\.UnifiedBatchedLogitsStayWithinBound"
    "ExactKernelTest\\.ARowDecodesTheSameAloneAndBesideAnother")

# TSan looks for races. Left out: tests in which one thread runs all of our code they reach (the
# engine, the pipeline runner on one fork, the snapshot reader), and the server's request-shape
# tests, whose requests cross the same queue and threads as the concurrent ones kept below
# (ServerTest.ABoundedLoad..., ServerForkTest.Concurrent..., the hang-up and cancel tests).
set(_swarmkv_not_under_tsan
    # one thread uses the context
    "EngineModelTest\\." "EngineModelForkTest\\." "ExactKernelTest\\." "TokenisationTest\\."
    "Gemma3Test\\.LoadsAndGeneratesDeterministically"
    # one thread drives the forks
    "ForkEquivalenceTest\\." "InexactForkTest\\." "ExactForkTest\\."
    "CorpusModelTest\\.EachDocumentEqualsItsOwnReprefillAndReduceAgentsSeeEveryAnswerInOrder"
    "PipelineModelTest\\.(ThePrefillReportsItsProgressAndAThrowStopsEveryAgent|BranchPositionsRestartingAtZeroAreCaught|ExactIsTheDefaultAndRefusedOnAModelLoadedWithoutItsKernels)"
    # one thread reads, restores or stores the snapshot
    "SnapshotModelTest\\." "SnapshotBindingModelTest\\."
    "SnapshotFileTest\\."
    # the shape of one request: parsed on the HTTP thread, answered as any other
    "ServerTest\\.(ToolChoiceMakesTheAnswerACallInOpenAIsShape|LogitBiasAndMinPAreApplied|EachBadRequestGetsItsStatusAndOpenAIsErrorShape)"
    "ServerTest\\.(AnUnlistedModelNameIsModelNotFound|APostBodyMustSayItIsJson|APostedPipelineKeepsCharactersOutsideTheBmp)"
    "ServerExactTest\\.(JsonResponseFormatsAnswerAsAConstrainedReprefill|LogprobsAreTheSameAloneAndInABatch|AnUnseededRequestDrawsItsSeedAndReturnsIt)"
    # ServerForkTest.AStoredDocumentPrefixIsRestoredInsteadOfPrefilled drives the same store threads
    "ServerExactTest\\.AStoredDocumentPrefixIsRestoredWholeAndAnswersBitForBit"
    # the engine thread's own bookkeeping (which cached prefix a request forks, when the cache
    # starts over): the queue and threads their requests cross are the concurrent tests' above
    "ServerExactTest\\.TheCacheStartsOverWhenItsCellsRunOut"
    "ServerForkTest\\.(ALaterRequestForksOnlyWhatTheCacheStillHolds|ALoneRequestEqualsAReprefillBitForBit)")

# The release preset runs the fork-equivalence suites on both models. It leaves out a test that
# another release test repeats, and the second model's instance (Gemma 3: sliding-window
# attention, another head size and template) where a test's subject does not depend on the
# architecture: a prompt rendered before the fork, the sampler's penalties, the server's cache
# bookkeeping and the posted pipeline's route. Exactness itself (every fork strategy, restores,
# batched steps, structured answers) stays on both.
set(_swarmkv_not_in_release
    # ASan's host-fork test: ExactForkTest.SharedAndHostEqualRecomputeOnALongDocument compares
    # host with none (on the Apache licence for Gemma 3, the Mozilla one for SmolLM2)
    "ForkEquivalenceTest\\.HostForkEqualsRecomputeOnTheApacheLicence/"
    "ForkEquivalenceTest\\.(PlaceholderAgentEqualsRecomputeOfItsRenderedPrompt|RepetitionControlAppliesIdenticallyInEveryFork)/gemma3"
    "ServerForkTest\\.(ALaterRequestForksOnlyWhatTheCacheStillHolds|APostedPipelineAnswersAsTheSameRunInProcess)/gemma3"
    "ServerExactTest\\.(TheCacheStartsOverWhenItsCellsRunOut|APostedStreamedPrefillIsPublishedForTheNextPost)/gemma3"
    "ServerExactTest\\.(APostedPipelineIsExactByDefaultAndAnswersAsTheSameRunInProcess|AnUnseededRequestDrawsItsSeedAndReturnsIt)/gemma3")

if(_swarmkv_sanitize MATCHES "address")
  set(_swarmkv_left_out ${_swarmkv_not_under_asan})
elseif(_swarmkv_sanitize STREQUAL "thread")
  set(_swarmkv_left_out ${_swarmkv_not_under_tsan})
else()
  set(_swarmkv_left_out ${_swarmkv_not_in_release})
endif()

foreach(_t IN LISTS swarmkv_unit_tests_TESTS swarmkv_model_tests_TESTS swarmkv_server_tests_TESTS)
  foreach(_p IN LISTS _swarmkv_left_out)
    if(_t MATCHES "${_p}")
      set_tests_properties("${_t}" PROPERTIES DISABLED TRUE)
      break()
    endif()
  endforeach()
endforeach()
