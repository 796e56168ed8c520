// expect_throws<E>(f): runs f, checks that it throws E (a wrong exception type or none is a test
// failure) and returns the message, so a test can check what the error says.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace dtrain::testutil {

template <class E, class F>
std::string expect_throws(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no exception";
  return {};
}

}  // namespace dtrain::testutil
