# The retry helper (issue 3), included by client/CMakeLists.txt:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/retry.cmake)
# It consumes only the TenantBudget interface (client.h), never the client implementation, so
# it builds and is tested without retrybudget::client.

# retrybudget::retry: Retry(), RetryPolicy, IsBudgetExhausted(). No gRPC.
add_library(retrybudget_retry ${CMAKE_CURRENT_LIST_DIR}/retry.cc)
add_library(retrybudget::retry ALIAS retrybudget_retry)
target_include_directories(retrybudget_retry PUBLIC
  $<BUILD_INTERFACE:${CMAKE_CURRENT_LIST_DIR}/include>
  $<INSTALL_INTERFACE:include>)
target_link_libraries(retrybudget_retry PUBLIC
  retrybudget::common absl::status absl::statusor absl::time absl::function_ref
  PRIVATE absl::random_random absl::strings absl::str_format absl::cord)

# retrybudget::retry_grpc: RetryUnary() for gRPC unary calls.
add_library(retrybudget_retry_grpc ${CMAKE_CURRENT_LIST_DIR}/retry_grpc.cc)
add_library(retrybudget::retry_grpc ALIAS retrybudget_retry_grpc)
target_link_libraries(retrybudget_retry_grpc PUBLIC retrybudget::retry gRPC::grpc++
  PRIVATE absl::strings)
